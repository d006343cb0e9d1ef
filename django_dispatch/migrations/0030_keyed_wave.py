"""On PostgreSQL, the one-statement wave for keyed jobs too, its lease checked,
its finish locking rows in id order.

Beside 0027's claim scan (unchanged):

``django_dispatch_finish_wave`` (replaced, same signature and result): 0027's
fenced finish, its ids sorted before the primary key's lookups, so its rows
are locked in id order whatever order the worker sent them in. The
heartbeat's renewal locks a worker's running rows in id order too
(``store.leases``): two statements locking the same rows in different
orders can deadlock.

``django_dispatch_lease_wave`` (replaced, same signature): 0027's lease of
the given ids, now only of rows still ``pending``. A worker still on 0027's
statement calls it; the statement of this version calls the next one.

``django_dispatch_lease_runnable``: the wave's lease of the rows its scan
locked. An unkeyed row is leased; a keyed one only if it is its partition's
head and nothing of its partition is active, the partition gate's rule
(``store.gates.partitions``); every one only while ``pending``. The keyed
candidates it did not lease are demoted (pending -> blocked) where the
partition's lock is free (``pg_try_advisory_xact_lock``, never waiting: the
rows are locked already) and, checked again in a statement that starts
after the lock, something runs or waits ahead of them
(``store.partitions.partitions_demote``). Returns the ids leased and the
ids demoted; the rest were passed by (the caller's gates claim them).

``django_dispatch_finish_keyed_wave``: ``django_dispatch_finish_wave`` for
a wave whose successes hold partition keys (``p_keys``): the keys' locks
first, waiting, in hash order (``store.partitions.lock_partitions``), before
any row lock; then the finish; then the promotion of the next job of each
key a winner freed, and a NOTIFY on ``p_channel`` if it promoted any
(``store.partitions.partitions_promote``). ``freed`` is what is left to
promote: keys of winners not in ``p_keys`` (their locks were not taken).

``django_dispatch_partition_head`` and ``django_dispatch_partition_active``:
a partition's head (its oldest live job, not yielding) and whether a job of
it is active (running, or cancelled and still held), as
``store.partitions.partition_heads`` reads them.

The constant 1146310740 is ``store.partitions.LOCK_CLASS``. The texts are
frozen here: a change needs a migration that replaces them. Reversible:
the reverse drops the new functions and restores 0027's text.
"""

from django.db import migrations

FINISH = """
CREATE OR REPLACE FUNCTION django_dispatch_finish_wave(
    p_ids bigint[], p_workers text[], p_epochs bigint[], p_values jsonb[],
    p_metered boolean[], p_walls float8[], p_cpus float8[], p_rss float8[],
    p_host text, p_outcome text, OUT won bigint[], OUT freed text[])
LANGUAGE plpgsql
-- Only nested loops over index scans, as 0027's: each id looked up in the
-- primary key, whatever the table's size when the plan was made, in the order
-- of the ids, sorted: the rows are locked in id order.
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
AS $$
BEGIN
    -- (state = 'running') IS TRUE, the same on a NOT NULL column, keeps the
    -- planner off the partial index of running jobs.
    WITH done AS (
        UPDATE django_dispatch_job AS j
        SET state = 'succeeded', return_value = d.return_value,
            finished_at = statement_timestamp(), lease_expires_at = NULL
        FROM (
            SELECT * FROM unnest(p_ids, p_workers, p_epochs, p_values, p_metered, p_walls,
                p_cpus, p_rss) AS u(id, worker_id, lease_epoch, return_value, metered, wall,
                cpu, rss)
            ORDER BY u.id
        ) AS d
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
LEASE = """
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
    WHERE j.id = d.id AND j.state = 'pending';
    GET DIAGNOSTICS leased = ROW_COUNT;
    RETURN leased;
END;
$$;
"""
LEASE_RUNNABLE = """
CREATE OR REPLACE FUNCTION django_dispatch_lease_runnable(
    p_ids bigint[], p_keys text[], p_worker text, p_lease_seconds float8,
    p_now timestamptz, p_namespace text, OUT leased bigint[], OUT demoted bigint[])
LANGUAGE plpgsql
-- Index scans only, each probe of a partition by its own index: a generic
-- plan left to itself hashed every running job of the namespace, or read the
-- live jobs' index whole, to answer for a handful of keys.
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
SET enable_bitmapscan = off SET enable_memoize = off
AS $$
DECLARE
    waiting bigint[];
    locked text[];
BEGIN
    IF p_ids IS NULL THEN
        RETURN;
    END IF;
    -- A keyed row: its partition's head, with nothing of it active (the
    -- partial unique index of running keyed jobs stands behind this). Here and
    -- below, (state = ...) IS TRUE, the same on a NOT NULL column, keeps the
    -- planner on the primary key, off the partial indexes of that state.
    WITH l AS (
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
        FROM unnest(p_ids, p_keys) AS d(id, partition_key)
        WHERE j.id = d.id AND (j.state = 'pending') IS TRUE AND (d.partition_key IS NULL OR (
            NOT django_dispatch_partition_active(p_namespace, d.partition_key)
            AND d.id = django_dispatch_partition_head(p_namespace, d.partition_key)))
        RETURNING j.id
    )
    SELECT array_agg(id) INTO leased FROM l;
    IF cardinality(leased) IS NOT DISTINCT FROM cardinality(p_ids) THEN
        RETURN;
    END IF;
    -- The keyed rows not leased, and of their keys those whose locks are free
    -- (never waiting: the rows are locked already).
    SELECT array_agg(d.id) INTO waiting FROM unnest(p_ids, p_keys) AS d(id, k)
    WHERE d.k IS NOT NULL AND NOT (d.id = ANY(COALESCE(leased, '{}'::bigint[])));
    IF waiting IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(s.k) INTO locked FROM (
        SELECT DISTINCT d.k FROM unnest(p_ids, p_keys) AS d(id, k)
        WHERE d.id = ANY(waiting) ORDER BY d.k
    ) AS s WHERE pg_try_advisory_xact_lock(1146310740, hashtext(s.k));
    IF locked IS NULL THEN
        RETURN;
    END IF;
    -- Under the locks, in a statement that starts after they were granted:
    -- demoted only if something of the key is active, or an older job of it
    -- is live (it is not the head).
    WITH dm AS (
        UPDATE django_dispatch_job AS j SET state = 'blocked'
        FROM unnest(waiting) AS d(id)
        WHERE j.id = d.id AND (j.state = 'pending') IS TRUE
            AND j.partition_key = ANY(locked)
            AND (django_dispatch_partition_active(j.namespace, j.partition_key)
                OR j.id IS DISTINCT FROM django_dispatch_partition_head(
                    j.namespace, j.partition_key))
        RETURNING j.id
    )
    SELECT array_agg(id) INTO demoted FROM dm;
END;
$$;
"""
#: A partition's head and whether something of it is active, as
#: ``store.partitions`` reads them (``_HEADS_SQL``): each an index probe of the
#: partition (``dispatch_job_part_live``; ``dispatch_job_one_running_per_partition``
#: and ``dispatch_job_part_cancelling``), PL/pgSQL so that its plan is made
#: once per server session (a SQL function's is made again for every query).
PARTITION_HELPERS = """
CREATE OR REPLACE FUNCTION django_dispatch_partition_head(p_namespace text, p_key text)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT h.id FROM django_dispatch_job AS h
        WHERE h.namespace = p_namespace AND h.partition_key = p_key
            AND h.state IN ('pending', 'blocked', 'running', 'scheduled')
            AND NOT (h.partition_yield AND h.state IN ('pending', 'scheduled')
                AND h.run_after > now())
        ORDER BY h.id LIMIT 1);
END;
$$;
CREATE OR REPLACE FUNCTION django_dispatch_partition_active(p_namespace text, p_key text)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM django_dispatch_job AS a
        WHERE a.namespace = p_namespace AND a.partition_key = p_key AND a.state = 'running'
    ) OR EXISTS (
        SELECT 1 FROM django_dispatch_job AS a
        WHERE a.namespace = p_namespace AND a.partition_key = p_key AND a.state = 'cancelled'
            AND a.lease_expires_at IS NOT NULL
    );
END;
$$;
"""
FINISH_KEYED = """
CREATE OR REPLACE FUNCTION django_dispatch_finish_keyed_wave(
    p_ids bigint[], p_workers text[], p_epochs bigint[], p_values jsonb[],
    p_metered boolean[], p_walls float8[], p_cpus float8[], p_rss float8[],
    p_host text, p_outcome text, p_keys text[], p_namespace text, p_channel text,
    OUT won bigint[], OUT freed text[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
SET enable_bitmapscan = off SET enable_memoize = off
AS $$
DECLARE
    promoted integer;
BEGIN
    -- The keys' locks before any row lock, in hash order: two transactions
    -- locking overlapping keys cannot deadlock.
    PERFORM pg_advisory_xact_lock(1146310740, s.h) FROM (
        SELECT DISTINCT hashtext(k) AS h FROM unnest(p_keys) AS k
        WHERE k IS NOT NULL ORDER BY 1
    ) AS s;
    SELECT f.won, f.freed INTO won, freed FROM django_dispatch_finish_wave(
        p_ids, p_workers, p_epochs, p_values, p_metered, p_walls, p_cpus, p_rss,
        p_host, p_outcome) AS f;
    IF freed IS NULL THEN
        RETURN;
    END IF;
    -- Each freed key's oldest live job, if blocked, becomes pending.
    UPDATE django_dispatch_job AS j SET state = 'pending'
    FROM (
        SELECT django_dispatch_partition_head(p_namespace, k.k) AS id
        FROM unnest(freed) AS k(k) WHERE k.k = ANY(COALESCE(p_keys, '{}'::text[]))
    ) AS h
    WHERE j.id = h.id AND (j.state = 'blocked') IS TRUE;
    GET DIAGNOSTICS promoted = ROW_COUNT;
    IF promoted > 0 THEN
        PERFORM pg_notify(p_channel, '');
    END IF;
    SELECT array_agg(k) INTO freed FROM unnest(freed) AS k
        WHERE NOT (k = ANY(COALESCE(p_keys, '{}'::text[])));
END;
$$;
"""
#: 0027's texts, for the reverse.
FINISH_0027 = """
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
LEASE_0027 = """
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
DROP = """
DROP FUNCTION IF EXISTS django_dispatch_finish_keyed_wave(
    bigint[], text[], bigint[], jsonb[], boolean[], float8[], float8[], float8[], text, text,
    text[], text, text);
DROP FUNCTION IF EXISTS django_dispatch_lease_runnable(
    bigint[], text[], text, float8, timestamptz, text);
DROP FUNCTION IF EXISTS django_dispatch_partition_head(text, text);
DROP FUNCTION IF EXISTS django_dispatch_partition_active(text, text);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in (FINISH, LEASE, PARTITION_HELPERS, LEASE_RUNNABLE, FINISH_KEYED):
            schema_editor.execute(sql)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in (DROP, FINISH_0027, LEASE_0027):
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0028_atomic_success_finished_at")]
    operations = [migrations.RunPython(create, restore)]
