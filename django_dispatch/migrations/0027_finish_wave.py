"""On PostgreSQL, a worker's one-statement wave as three functions: the
fenced finish of its successes, the claim's scan, and the lease of what the
scan locked.

A worker's wave (``store.wave``) is one statement: the successes' fenced
UPDATE, their usage records, the claim that refills the slots and its
lease. Sent as SQL it is parsed, analysed and planned on every wave (Django
prepares nothing, and PgBouncer in transaction mode passes no prepared
statements), and planning was about 40% of its server time, the planner
weighing the job table's 21 indexes at every reference to the table. A
function's statements are planned once per server session and then reused,
and each function here forces its generic plan and allows its planner only
the plan it must have, so the plan is the same whatever the table held when
it was made: the finish and the lease look each id up in the primary key
(no hash or merge join, no sequential scan), the scan reads the claim index
in its order and stops at the window (no sort, no bitmap or sequential
scan; a generic plan left to itself may sort every due job to find the
first few). The statement that calls them passes PgBouncer in transaction
mode as any other.

``django_dispatch_finish_wave``, as the SQL it replaces did: every id whose
row is still ``running`` under the same worker and lease epoch becomes
``succeeded`` with its return value; a row whose fence fails (cancelled,
timed out, reclaimed) is left alone. Each winner with ``p_metered`` true
gets its usage record: what the row knows taken from the row, what the
worker measured from the arrays. It returns the winners' ids (``won``, NULL
for none) and the partition keys they freed (``freed``, NULL for none). The
arrays are parallel (``unnest`` pads shorter ones with NULL: no usage
arrays, no records).

``django_dispatch_claim_scan``: ``sources.fused_pg.CANDIDATES_CTE``'s scan
(due pending jobs without needs of a namespace, in claim order, locked,
skipping rows another claimer holds), the job table's rows.

``django_dispatch_lease_wave``: ``store.leasing``'s lease of the given ids,
rows the calling statement has locked.

The texts are frozen here: a change needs a migration that replaces them.
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
SET plan_cache_mode = force_generic_plan
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
#: The lease of the rows a wave's claim locked: ``store.leasing``'s SET list
#: (``_LEASE_SET``, here with the row's own columns and ``p_now``, the claim's
#: database clock), by primary key; the rows are the caller's, locked in the
#: same statement. Returns how many rows it leased.
CREATE_LEASE = """
CREATE OR REPLACE FUNCTION django_dispatch_lease_wave(
    p_ids bigint[], p_worker text, p_lease_seconds float8, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
AS $$
DECLARE
    leased integer;
BEGIN
    UPDATE django_dispatch_job AS j SET
        state = 'running',
        worker_id = p_worker,
        lease_epoch = j.lease_epoch + 1,
        lease_expires_at = p_now + p_lease_seconds * interval '1 second',
        heartbeat_at = p_now,
        attempts = j.attempts + 1,
        started_at = COALESCE(j.started_at, p_now),
        last_attempted_at = p_now,
        worker_ids = COALESCE(j.worker_ids, '[]'::jsonb) || jsonb_build_array(p_worker)
    FROM unnest(p_ids) AS d(id)
    WHERE j.id = d.id;
    GET DIAGNOSTICS leased = ROW_COUNT;
    RETURN leased;
END;
$$;
"""
#: The claim's scan (``sources.fused_pg.CANDIDATES_CTE``) for a wave: due
#: pending jobs without needs of ``p_namespace``, in ``p_queues`` (NULL: every
#: queue) and not in ``p_paused`` (NULL: none), in claim order, locked, at
#: most ``p_window``, skipping rows another claimer holds. Its generic plan can
#: be nothing but the ordered scan of the claim index that stops at the
#: window: no sort, no bitmap or sequential scan is allowed it (a generic
#: plan left to itself may sort every due job to find the first few).
CREATE_SCAN = """
CREATE OR REPLACE FUNCTION django_dispatch_claim_scan(
    p_namespace text, p_window integer, p_queues text[], p_paused text[])
RETURNS SETOF django_dispatch_job
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM django_dispatch_job
    WHERE namespace = p_namespace AND state = 'pending' AND resource_shape IS NULL
        AND run_after <= now()
        AND (p_queues IS NULL OR queue_name = ANY(p_queues))
        AND (p_paused IS NULL OR NOT (queue_name = ANY(p_paused)))
    ORDER BY priority DESC, run_after, id
    LIMIT p_window
    FOR UPDATE SKIP LOCKED;
END;
$$;
"""
DROP = """
DROP FUNCTION IF EXISTS django_dispatch_claim_scan(text, integer, text[], text[]);
DROP FUNCTION IF EXISTS django_dispatch_lease_wave(bigint[], text, float8, timestamptz);
DROP FUNCTION IF EXISTS django_dispatch_finish_wave(
    bigint[], text[], bigint[], jsonb[], boolean[], float8[], float8[], float8[], text, text);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)
        schema_editor.execute(CREATE_LEASE)
        schema_editor.execute(CREATE_SCAN)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0026_atomic_success")]
    operations = [migrations.RunPython(create, drop)]
