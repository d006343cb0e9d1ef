"""On PostgreSQL, the wave's functions read only the wave's rows whatever the
job table held when their plans were made.

Each function forces a generic plan, made at a server session's first call
and kept for the session's life. A nested loop joining the ids (``unnest``)
to the job table lets the planner choose, at that first call, which side
goes outside: chosen while the table was small (a fresh database, workers
started before the load, a ``ctx.map`` set inserted after them), the plan
scans the whole primary key at every wave, growing with the table. The
plans here have one shape whatever the table's size, and their cost grows
with the wave only:

``django_dispatch_finish_wave`` (same signature and result): no join; the
ids, sorted, are the primary key's index condition, one probe per id, in id
order (the rows are locked in id order, as the heartbeat locks them), and
each row finds its values (worker, epoch, return value, usage) by a binary
search of its id. (``j.id = ANY(p_ids)`` beside a nested loop's join would
look every id up again for each row: quadratic in the wave.)

``django_dispatch_lease_wave`` and ``django_dispatch_lease_runnable`` (same
signatures and results): no join; ``j.id = ANY(p_ids)`` is the primary key's
index condition, one probe per id (no bitmap scan, which may read a partial
index whole). The keyed lease reads the row's own ``partition_key``, and
returns the ids it leased in id order (``store.wave`` searches them). What it
left waiting is the keyed ids less those leased (``EXCEPT``, not a search of
one array per element of the other); the demotion reads its rows by id.

``django_dispatch_finish_keyed_wave`` (same signature and result): the
promotion reads the freed keys' heads by id; the keys it may promote are the
freed ones among ``p_keys`` (``INTERSECT``), those left to the caller the rest
(``EXCEPT``).

The texts are frozen here: a change needs a migration that replaces them.
Reversible: the reverse restores 0030's texts.
"""

import importlib

from django.db import migrations

_0030 = importlib.import_module("django_dispatch.migrations.0030_keyed_wave")

FINISH = """
CREATE OR REPLACE FUNCTION django_dispatch_finish_wave(
    p_ids bigint[], p_workers text[], p_epochs bigint[], p_values jsonb[],
    p_metered boolean[], p_walls float8[], p_cpus float8[], p_rss float8[],
    p_host text, p_outcome text, OUT won bigint[], OUT freed text[])
LANGUAGE plpgsql
-- The plan is made once per session, whatever the table's size then, and must
-- read only the wave's rows: no join, the ids the primary key's index
-- condition, one probe each, in id order (the rows are locked in that order).
-- A nested loop with the ids, made on a small table, scanned the whole table
-- at every wave; with the ids beside it, it looked every id up again for each
-- row. A sequential or bitmap scan would read more than the wave's rows, or
-- lose the id order.
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    ids bigint[];
    at integer[];
BEGIN
    -- The ids sorted, and where each sorted id sits in the arrays: a row's
    -- values are found by a binary search of its id (width_bucket: the index
    -- of the last id not above it), no join and no scan of an array per row.
    -- An id twice in one wave (a stale attempt's entry beside the current
    -- one's) resolves to its highest epoch, the only one the fence can match;
    -- width_bucket refuses NULLs, which match no row anyway.
    SELECT array_agg(u.id ORDER BY u.id, p_epochs[u.n]),
        array_agg(u.n::integer ORDER BY u.id, p_epochs[u.n]) INTO ids, at
    FROM unnest(p_ids) WITH ORDINALITY AS u(id, n) WHERE u.id IS NOT NULL;
    -- (state = 'running') IS TRUE, the same on a NOT NULL column, keeps the
    -- planner off the partial index of running jobs.
    WITH done AS (
        UPDATE django_dispatch_job AS j
        SET state = 'succeeded', return_value = p_values[at[width_bucket(j.id, ids)]],
            finished_at = statement_timestamp(), lease_expires_at = NULL
        WHERE j.id = ANY(ids) AND (j.state = 'running') IS TRUE
            AND j.worker_id = p_workers[at[width_bucket(j.id, ids)]]
            AND j.lease_epoch = p_epochs[at[width_bucket(j.id, ids)]]
        RETURNING j.id, j.partition_key, j.namespace, j.task_path, j.queue_name,
            j.attempts, j.worker_id, j.last_attempted_at, j.resources,
            at[width_bucket(j.id, ids)] AS n
    ),
    recorded AS (
        INSERT INTO django_dispatch_jobusage (namespace, job_id, task_path, queue_name,
            attempt, worker_id, host, outcome, started_at, wall_seconds, cpu_seconds,
            peak_rss_mb, resources)
        SELECT namespace, id, task_path, queue_name, attempts, worker_id, p_host,
            p_outcome, last_attempted_at, p_walls[n], p_cpus[n], p_rss[n], resources
        FROM done WHERE p_metered[n]
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
-- No join: the ids are the primary key's index condition, one probe each,
-- whatever the table's size when the plan was made.
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    leased integer;
BEGIN
    -- (state = 'pending') IS TRUE, the same on a NOT NULL column, keeps the
    -- planner on the primary key, off the partial indexes of pending jobs.
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
    WHERE j.id = ANY(p_ids) AND (j.state = 'pending') IS TRUE;
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
-- live jobs' index whole, to answer for a handful of keys. The job table is
-- read by id, the ids the primary key's index condition (no join with them:
-- the plan, made once per session, could put the whole table outside).
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off
SET enable_bitmapscan = off SET enable_memoize = off
AS $$
DECLARE
    leased_keys text[];
    waiting bigint[];
    waiting_keys text[];
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
        WHERE j.id = ANY(p_ids) AND (j.state = 'pending') IS TRUE AND (j.partition_key IS NULL OR (
            NOT django_dispatch_partition_active(p_namespace, j.partition_key)
            AND j.id = django_dispatch_partition_head(p_namespace, j.partition_key)))
        RETURNING j.id, j.partition_key
    )
    -- In id order: the wave's statement (store.wave) finds each candidate in
    -- it by a binary search.
    SELECT array_agg(id ORDER BY id), array_agg(partition_key ORDER BY id)
    INTO leased, leased_keys FROM l;
    IF cardinality(leased) IS NOT DISTINCT FROM cardinality(p_ids) THEN
        RETURN;
    END IF;
    -- The keyed rows not leased (a set difference, not a search of the leased
    -- ids for each id), and of their keys those whose locks are free (never
    -- waiting: the rows are locked already).
    SELECT array_agg(w.id), array_agg(DISTINCT w.k) INTO waiting, waiting_keys FROM (
        SELECT d.id, d.k FROM unnest(p_ids, p_keys) AS d(id, k) WHERE d.k IS NOT NULL
        EXCEPT
        SELECT u.id, u.k FROM unnest(leased, leased_keys) AS u(id, k)
    ) AS w;
    IF waiting IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(s.k) INTO locked FROM (
        SELECT k FROM unnest(waiting_keys) AS k ORDER BY k
    ) AS s WHERE pg_try_advisory_xact_lock(1146310740, hashtext(s.k));
    IF locked IS NULL THEN
        RETURN;
    END IF;
    -- Under the locks, in a statement that starts after they were granted:
    -- demoted only if something of the key is active, or an older job of it
    -- is live (it is not the head).
    WITH dm AS (
        UPDATE django_dispatch_job AS j SET state = 'blocked'
        WHERE j.id = ANY(waiting) AND (j.state = 'pending') IS TRUE
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
    heads bigint[];
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
    -- Each freed key's oldest live job, if blocked, becomes pending: the keys
    -- locked above only, the heads read by id (no join with the job table:
    -- the plan, made once per session, could put the whole table outside).
    SELECT array_agg(django_dispatch_partition_head(p_namespace, s.k)) INTO heads FROM (
        SELECT k FROM unnest(freed) AS k INTERSECT SELECT k FROM unnest(p_keys) AS k
    ) AS s;
    UPDATE django_dispatch_job AS j SET state = 'pending'
    WHERE j.id = ANY(heads) AND (j.state = 'blocked') IS TRUE;
    GET DIAGNOSTICS promoted = ROW_COUNT;
    IF promoted > 0 THEN
        PERFORM pg_notify(p_channel, '');
    END IF;
    SELECT array_agg(s.k) INTO freed FROM (
        SELECT k FROM unnest(freed) AS k EXCEPT SELECT k FROM unnest(p_keys) AS k
    ) AS s;
END;
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in (FINISH, LEASE, LEASE_RUNNABLE, FINISH_KEYED):
            schema_editor.execute(sql)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in (_0030.FINISH, _0030.LEASE, _0030.LEASE_RUNNABLE, _0030.FINISH_KEYED):
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0031_map_count")]
    operations = [migrations.RunPython(create, restore)]
