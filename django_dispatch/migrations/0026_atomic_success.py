"""On PostgreSQL, an atomic job's fenced success and usage record as one function.

An atomic job's success is written in its body's transaction, one job at a
time (``store.atomic_finish``), so nothing shares its statement the way a
wave of plain successes shares one. Sent as SQL, that statement would be
parsed, analysed and planned on every job (Django prepares nothing, and
PgBouncer in transaction mode passes no prepared statements), the planner
weighing each of the job table's 21 indexes: most of the server's time for an
atomic job (docs/performance.md has the profile). A PL/pgSQL function's statements are
planned once per server session and then reused (the UPDATE is a lookup by
primary key, so the generic plan is the plan), and its call is a plain
statement that passes PgBouncer in transaction mode as any other.

What it does: the fenced UPDATE (id, ``state = 'running'``, worker, lease
epoch) to succeeded; when it matched no row (cancelled, timed out or
reclaimed meanwhile), an error, so that the ``COMMIT`` sent with the call
never runs and the body's writes roll back with it; else, with
``p_record``, the attempt's usage record, what the row knows taken from the
row. The error is SQLSTATE 22P02 with the message the caller looks for
(``atomic_finish.LOST``). The text is frozen here: a change needs a
migration that replaces the function.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION django_dispatch_atomic_success(
    p_id bigint, p_worker text, p_epoch bigint, p_value jsonb, p_record boolean,
    p_host text, p_outcome text, p_wall float8, p_cpu float8, p_rss float8)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    done record;
BEGIN
    -- (state = 'running') IS TRUE: the same on a NOT NULL column, and it keeps
    -- the planner on the primary key, never the partial index of running jobs.
    UPDATE django_dispatch_job
    SET state = 'succeeded', return_value = p_value, finished_at = now(),
        lease_expires_at = NULL
    WHERE id = p_id AND (state = 'running') IS TRUE AND worker_id = p_worker
      AND lease_epoch = p_epoch
    RETURNING namespace, task_path, queue_name, attempts, worker_id, last_attempted_at,
        resources
    INTO done;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_text_representation',
            MESSAGE = 'django_dispatch: lease lost, success rolled back';
    END IF;
    IF p_record THEN
        INSERT INTO django_dispatch_jobusage (namespace, job_id, task_path, queue_name,
            attempt, worker_id, host, outcome, started_at, wall_seconds, cpu_seconds,
            peak_rss_mb, resources)
        VALUES (done.namespace, p_id, done.task_path, done.queue_name, done.attempts,
            done.worker_id, p_host, p_outcome, done.last_attempted_at, p_wall, p_cpu, p_rss,
            done.resources);
    END IF;
    RETURN 1;
END;
$$;
"""
DROP = """
DROP FUNCTION IF EXISTS django_dispatch_atomic_success(
    bigint, text, bigint, jsonb, boolean, text, text, float8, float8, float8);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0024_map_child_success")]
    operations = [migrations.RunPython(create, drop)]
