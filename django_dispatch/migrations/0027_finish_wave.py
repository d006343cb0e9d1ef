"""On PostgreSQL, the fenced finish of a wave of successes as one function.

A worker's wave (``store.wave``) is one statement: the successes' fenced
UPDATE, their usage records and the claim that refills the slots. Sent as
SQL it is parsed, analysed and planned on every wave (Django prepares
nothing, and PgBouncer in transaction mode passes no prepared statements),
and planning was about 40% of its server time, the planner weighing the job
table's 21 indexes at every reference to the table. The finish and the
records are here planned once per server session and then reused: the
UPDATE looks each id up in the primary key (the function allows the planner
nothing else: no hash or merge join, no sequential scan), so the generic
plan is the plan; the claim, whose plan depends on the data, stays SQL in the statement
that calls this. The call passes PgBouncer in transaction mode as any other
statement.

What it does, as the SQL it replaces did: every id whose row is still
``running`` under the same worker and lease epoch becomes ``succeeded``
with its return value; a row whose fence fails (cancelled, timed out,
reclaimed) is left alone. Each winner with ``p_metered`` true gets its usage
record: what the row knows taken from the row, what the worker measured
from the arrays. It returns the winners' ids (``won``, NULL for none) and
the partition keys they freed (``freed``, NULL for none). The arrays are
parallel (``unnest`` pads shorter ones with NULL: no usage arrays, no
records). The text is frozen here: a change needs a migration that replaces
the function.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION django_dispatch_finish_wave(
    p_ids bigint[], p_workers text[], p_epochs bigint[], p_values jsonb[],
    p_metered boolean[], p_walls float8[], p_cpus float8[], p_rss float8[],
    p_host text, p_outcome text, OUT won bigint[], OUT freed text[])
LANGUAGE plpgsql
-- Only nested loops over index scans: each id looked up in the primary key,
-- whatever the table's size when the plan was made (a generic plan guesses
-- ten ids; a hash join over a scan of the table would read it all per wave).
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
AS $$
BEGIN
    -- (state = 'running') IS TRUE, the same on a NOT NULL column, keeps the
    -- planner off the partial index of running jobs (a bitmap scan of it
    -- reads every dead entry).
    WITH done AS (
        UPDATE django_dispatch_job AS j
        SET state = 'succeeded', return_value = d.return_value,
            finished_at = statement_timestamp(), lease_expires_at = NULL
        FROM unnest(p_ids, p_workers, p_epochs, p_values, p_metered, p_walls, p_cpus, p_rss)
            AS d(id, worker_id, lease_epoch, return_value, metered, wall, cpu, rss)
        WHERE j.id = d.id AND (j.state = 'running') IS TRUE
            AND j.worker_id = d.worker_id AND j.lease_epoch = d.lease_epoch
        RETURNING j.id, j.partition_key, j.namespace, j.task_path, j.queue_name,
            j.attempts, j.worker_id, j.last_attempted_at, j.resources,
            d.metered, d.wall, d.cpu, d.rss
    ),
    recorded AS (
        INSERT INTO django_dispatch_jobusage (namespace, job_id, task_path, queue_name,
            attempt, worker_id, host, outcome, started_at, wall_seconds, cpu_seconds,
            peak_rss_mb, resources)
        SELECT namespace, id, task_path, queue_name, attempts, worker_id, p_host,
            p_outcome, last_attempted_at, wall, cpu, rss, resources
        FROM done WHERE metered
    )
    SELECT array_agg(id),
        array_agg(DISTINCT partition_key) FILTER (WHERE partition_key IS NOT NULL)
    INTO won, freed
    FROM done;
END;
$$;
"""
DROP = """
DROP FUNCTION IF EXISTS django_dispatch_finish_wave(
    bigint[], text[], bigint[], jsonb[], boolean[], float8[], float8[], float8[], text, text);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0026_atomic_success")]
    operations = [migrations.RunPython(create, drop)]
