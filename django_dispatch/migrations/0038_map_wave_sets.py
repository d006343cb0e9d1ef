"""On PostgreSQL, a wave's step claims and its ``ctx.map`` children's successes
written as one statement per wave instead of several per step.

0035's claim and 0036's map wave loop over their arrays, a statement or more
per step (each by primary key, so that no plan reads a whole table): at a
dozen children a wave, each statement's own start and end cost more than its
row. Measured on the tables of a 12,000-child set (one server, waves
alternating between the two forms): the claim 241 -> 139 us a child, the
success (run lock, checks, step and run updates) 356 -> 212 us.

The same rows and fences as before, and the same order of locks for each
kind of row: a wave's steps in its jobs' order; a wave's children's runs in
the arrays' order, each before its step, all before any job row:

``django_dispatch_wave_step_claims``: each step ``ready``, entrusted to its
job, of its generation, locked ``SKIP LOCKED`` (the wave holds its jobs'
locks and must never wait for a step's), then claimed with a fresh claim id.

``django_dispatch_map_wave_children`` (new; 0036's loop, called by
``django_dispatch_finish_map_wave`` before the jobs' finish): the children's
runs locked in the array's order (a run still running, an uncounted map
child), those with another step in their run or whose set still admits
children left out, then each step succeeded under its claim, then the run of
each step written, with the output of the entry whose claim matched.
``mapped`` lists the children written, in the array's order. One snapshot
serves the whole statement: a run row changed while the statement waited for
its lock is checked again in its new version, but the two checks on steps
read the snapshot from before the wait, where each of 0036's statements took
a new one. Neither can turn stale in a way that writes a child it must not:
a run's steps are inserted with the run, and a set still admitting seen so
only sends the child to the general path, which decides again.

Each plan is a nested loop over the arrays with lookups through indexes
(the primary keys, the step table's (run, name)), whatever the tables'
statistics say (the ``SET`` options, in force only while the function runs,
also for a trigger a site adds to these tables): planned at a set's start,
when the tables held a row or two, a join chose sequential scans and hash
joins, about 37 ms a call once the tables had grown. The jobs' finish keeps
its own plans: it is called from ``django_dispatch_finish_map_wave``, which
sets nothing.

The texts are frozen here: a change needs a migration that replaces them.
Unapplied, 0035's and 0036's texts are put back.
"""

from importlib import import_module

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION django_dispatch_wave_step_claims(
    p_jobs bigint[], p_steps bigint[], p_generations integer[])
RETURNS TABLE (o_job bigint, o_step bigint, o_claim text,
               o_run_id bigint, o_name text, o_handler_path text, o_generation integer,
               o_attempts integer, o_failures integer, o_max_attempts integer, o_backoff jsonb,
               o_timeout double precision, o_checkpoint jsonb, o_depends_on jsonb,
               o_waits jsonb, o_run_name text, o_run_input jsonb, o_run_queue_name text,
               o_run_call_context jsonb, o_run_map_batch text)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
BEGIN
    RETURN QUERY
    WITH c AS MATERIALIZED (
        SELECT s.id, u.job
        FROM unnest(p_jobs, p_steps, p_generations) WITH ORDINALITY AS u(job, step, gen, n)
        JOIN django_dispatch_workflowtask AS s ON s.id = u.step
        WHERE s.generation = u.gen AND s.job_id = u.job AND s.state = 'ready'
        ORDER BY u.n
        FOR UPDATE OF s SKIP LOCKED
    )
    UPDATE django_dispatch_workflowtask AS s
    SET state = 'running', claim_id = replace(gen_random_uuid()::text, '-', ''),
        attempts = s.attempts + 1,
        heartbeat_at = statement_timestamp(),
        started_at = COALESCE(s.started_at, statement_timestamp()),
        updated_at = statement_timestamp()
    FROM c, django_dispatch_workflowrun AS r
    WHERE s.id = c.id AND r.id = s.run_id
    RETURNING c.job, s.id, s.claim_id::text,
        s.run_id, s.name::text, s.handler_path::text, s.generation, s.attempts,
        s.failures, s.max_attempts, s.backoff, s.timeout, s.checkpoint, s.depends_on,
        s.waits, r.name::text, r.input, r.queue_name::text, r.call_context,
        r.map_batch::text;
END;
$$;

CREATE OR REPLACE FUNCTION django_dispatch_map_wave_children(
    p_runs bigint[], p_steps bigint[], p_claims text[], p_outputs jsonb[])
RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    mapped jsonb;
BEGIN
    WITH child AS MATERIALIZED (
        SELECT u.n, u.run, u.step, u.claim, u.output,
               r.parent_task_id, r.parent_run_id, r.map_batch
        FROM unnest(p_runs, p_steps, p_claims, p_outputs)
             WITH ORDINALITY AS u(run, step, claim, output, n)
        JOIN django_dispatch_workflowrun AS r ON r.id = u.run
        WHERE r.state = 'running' AND NOT r.map_counted
          AND r.map_batch IS NOT NULL AND r.parent_task_id IS NOT NULL
        ORDER BY u.n
        FOR UPDATE OF r
    ), ok AS MATERIALIZED (
        SELECT c.* FROM child AS c
        WHERE NOT EXISTS (SELECT 1 FROM django_dispatch_workflowtask AS o
                          WHERE o.run_id = c.run AND o.id <> c.step)
          AND NOT EXISTS (SELECT 1 FROM django_dispatch_workflowtask AS p
                          WHERE p.id = c.parent_task_id AND p.state = 'waiting'
                            AND p.map_batch = c.map_batch AND p.map_started < p.map_total)
    ), stepped AS (
        UPDATE django_dispatch_workflowtask AS s
        SET state = 'succeeded', output = ok.output, claim_id = NULL,
            finished_at = statement_timestamp(), updated_at = statement_timestamp()
        FROM ok
        WHERE s.id = ok.step AND s.claim_id = ok.claim AND s.state = 'running'
          AND s.run_id = ok.run
        RETURNING s.run_id, ok.n, ok.output, ok.parent_task_id, ok.parent_run_id, ok.map_batch
    ), ran AS (
        UPDATE django_dispatch_workflowrun AS r
        SET state = 'succeeded', output = stepped.output, finished_at = statement_timestamp(),
            updated_at = statement_timestamp(), map_counted = true
        FROM stepped
        WHERE r.id = stepped.run_id
        RETURNING stepped.n, r.id, stepped.parent_task_id, stepped.parent_run_id,
            stepped.map_batch
    )
    SELECT coalesce(jsonb_agg(jsonb_build_array(ran.id, ran.parent_task_id,
                                                ran.parent_run_id, ran.map_batch)
                              ORDER BY ran.n), '[]'::jsonb)
    INTO mapped FROM ran;
    RETURN mapped;
END;
$$;

CREATE OR REPLACE FUNCTION django_dispatch_finish_map_wave(
    p_ids bigint[], p_workers text[], p_epochs bigint[], p_values jsonb[],
    p_metered boolean[], p_walls float8[], p_cpus float8[], p_rss float8[],
    p_host text, p_outcome text, p_keys text[], p_namespace text, p_channel text,
    p_runs bigint[], p_steps bigint[], p_claims text[], p_outputs jsonb[],
    OUT won bigint[], OUT freed text[], OUT mapped jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    mapped := django_dispatch_map_wave_children(p_runs, p_steps, p_claims, p_outputs);
    IF p_keys IS NULL THEN
        SELECT f.won, f.freed INTO won, freed FROM django_dispatch_finish_wave(
            p_ids, p_workers, p_epochs, p_values, p_metered, p_walls, p_cpus, p_rss,
            p_host, p_outcome) AS f;
    ELSE
        SELECT f.won, f.freed INTO won, freed FROM django_dispatch_finish_keyed_wave(
            p_ids, p_workers, p_epochs, p_values, p_metered, p_walls, p_cpus, p_rss,
            p_host, p_outcome, p_keys, p_namespace, p_channel) AS f;
    END IF;
END;
$$;
"""
DROP = """
DROP FUNCTION IF EXISTS django_dispatch_map_wave_children(bigint[], bigint[], text[], jsonb[]);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def restore(apps, schema_editor):
    """0035's claim and 0036's map wave again (``CREATE OR REPLACE``: same signatures)."""
    if schema_editor.connection.vendor == "postgresql":
        for name in ("0035_wave_step_claims", "0036_wave_map_children"):
            schema_editor.execute(import_module(f"{__package__}.{name}").CREATE)
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0037_step_run_indexes")]
    operations = [migrations.RunPython(create, restore)]
