"""The wave's function: a worker's successes, their usage records and its claim in
one statement whose plans the server keeps (``store.wave``, ``WAVE_FUNCTION``).

A PL/pgSQL function: its statement is planned once per server session (a
generic plan, ``plan_cache_mode = force_generic_plan``), not on every wave,
and behind PgBouncer in transaction mode that needs nothing of the pooler,
unlike a prepared statement. PostgreSQL only; nothing on SQLite.

The text is frozen here as ``store.wave.wave_function_sql`` rendered it for
this migration; tests/store/test_wave.py holds the installed function to the
current rendering, so a change to the wave's SQL, the lease or the claimed
columns needs a migration that installs it again.

Locks: creating a function takes none on the job table; run at any time.
"""

from django.db import migrations

CREATE = r"""
CREATE OR REPLACE FUNCTION django_dispatch_wave(
    p_ids bigint[], p_workers text[], p_epochs bigint[], p_values jsonb[], p_usage jsonb,
    p_worker_id text, p_lease_seconds double precision, p_window integer,
    p_namespace text, p_queues text[], p_paused text[]
) RETURNS TABLE (won bigint[], freed text[], id bigint, task_path varchar(255), backend varchar(100), queue_name varchar(100), priority smallint, run_after timestamp with time zone, args jsonb, kwargs jsonb, deferred_until timestamp with time zone, partition_key varchar(255), idempotency_key varchar(255), attempts integer, max_attempts integer, worker_lost_count integer, lease_epoch integer, checkpoint jsonb, errors jsonb, worker_ids jsonb, enqueued_at timestamp with time zone, started_at timestamp with time zone, trace_context jsonb, call_context jsonb, resources jsonb, concurrency_key varchar(255), concurrency_limit integer, rate_limit integer, rate_period integer, db_now timestamptz, leased boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan
AS $wave$
#variable_conflict use_column
BEGIN
RETURN QUERY WITH done AS (UPDATE "django_dispatch_job" AS j SET
    state = 'succeeded', return_value = d.return_value, finished_at = now(),
    lease_expires_at = NULL
FROM unnest(p_ids::bigint[], p_workers::text[], p_epochs::bigint[], p_values::jsonb[])
    AS d(id, worker_id, lease_epoch, return_value)
WHERE j.id = d.id AND j.state = 'running' AND j.worker_id = d.worker_id
    AND j.lease_epoch = d.lease_epoch
RETURNING j.id, j.partition_key),
recorded AS (INSERT INTO "django_dispatch_jobusage" (namespace, job_id, task_path, queue_name, attempt, worker_id, host,
    outcome, started_at, wall_seconds, cpu_seconds, peak_rss_mb, resources)
SELECT r->>0, (r->>1)::bigint, r->>2, r->>3, (r->>4)::integer, r->>5, r->>6, r->>7,
    (r->>8)::timestamptz, (r->>9)::float8, (r->>10)::float8, (r->>11)::float8,
    NULLIF(r->12, 'null'::jsonb)
FROM done JOIN jsonb_array_elements(p_usage::jsonb) AS r ON (r->>1)::bigint = done.id),
candidates AS MATERIALIZED (
    SELECT id, task_path, backend, queue_name, priority, run_after, args, kwargs, deferred_until, partition_key, idempotency_key, attempts, max_attempts, worker_lost_count, lease_epoch, checkpoint, errors, worker_ids, enqueued_at, started_at, trace_context, call_context, resources, concurrency_key, concurrency_limit, rate_limit, rate_period, now() AS db_now
    FROM "django_dispatch_job"
    WHERE namespace = p_namespace AND state = 'pending' AND resource_shape IS NULL
        AND run_after <= now()  AND (cardinality(p_queues) = 0 OR queue_name = ANY(p_queues)) AND NOT (queue_name = ANY(p_paused))
    ORDER BY priority DESC, run_after, id
    LIMIT p_window
    FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE "django_dispatch_job" AS j SET
    state = 'running',
    worker_id = p_worker_id::text,
    lease_epoch = j.lease_epoch + 1,
    lease_expires_at = c.db_now + p_lease_seconds * interval '1 second',
    heartbeat_at = c.db_now,
    attempts = j.attempts + 1,
    started_at = COALESCE(j.started_at, c.db_now),
    last_attempted_at = c.db_now,
    worker_ids = COALESCE(j.worker_ids, '[]'::jsonb) || jsonb_build_array(p_worker_id::text)
    FROM (
        SELECT id, db_now FROM candidates WHERE partition_key IS NULL AND concurrency_key IS NULL
         ORDER BY priority DESC, run_after, id LIMIT p_window
    ) AS c
    WHERE j.id = c.id
    RETURNING j.id
)
SELECT w.won, w.freed, c.*
FROM (
    SELECT array_agg(id) AS won,
        array_agg(DISTINCT partition_key::text) FILTER (WHERE partition_key IS NOT NULL) AS freed
    FROM done
) AS w LEFT JOIN (SELECT candidates.*, leased.id IS NOT NULL AS leased
FROM candidates LEFT JOIN leased ON leased.id = candidates.id) AS c ON true
ORDER BY c.priority DESC, c.run_after, c.id;
END
$wave$
"""
#: Its signature, for DROP (a changed result type cannot be replaced in place).
SIGNATURE = (
    "django_dispatch_wave(bigint[], text[], bigint[], jsonb[], jsonb, text, double precision,"
    " integer, text, text[], text[])"
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0022_admin_list_indexes")]
    operations = [migrations.RunPython(create, drop)]
