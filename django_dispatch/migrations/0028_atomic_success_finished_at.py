"""On PostgreSQL, an atomic job's ``finished_at`` is when its success was written.

``django_dispatch_atomic_success`` (migration 0026) wrote ``finished_at =
now()``: PostgreSQL's ``now()`` is the start of the transaction, and an atomic
job's transaction is its body's, so a job whose body wrote something early
and then ran for a minute was recorded as finished a minute early (its
duration in the admin and the metrics short by as much).
``statement_timestamp()`` is when the server received the success's call,
which is sent once the body has returned: the end of the job, as a plain
job's wave writes it. Otherwise the function is 0026's, signature and all
(``store.atomic_finish`` calls it unchanged); the text is frozen here.
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
    SET state = 'succeeded', return_value = p_value, finished_at = statement_timestamp(),
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


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def restore(apps, schema_editor):
    """Back to 0026's text (``now()``), which that migration's state expects."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            CREATE.replace("finished_at = statement_timestamp()", "finished_at = now()")
        )


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0029_dead_letter_unreplayed_index")]
    operations = [migrations.RunPython(create, restore)]
