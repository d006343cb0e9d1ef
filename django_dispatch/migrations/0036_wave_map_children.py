"""On PostgreSQL, one-step ``ctx.map`` children's successes written by the wave
that finishes their jobs, and their count on the parent step once per wave.

A child written by its own statement (``django_dispatch_map_child_finish``,
0033) costs a round trip of its own and a count on the parent step, whose
row lock every child of the set takes in turn: in a drain of 10,000 children
each waited about 0.9 ms for it. Here the worker's wave carries the children
whose jobs it finishes (``store.workflows.mapwave``), and after its commit
the worker counts them on their parent step with one update per set.

``django_dispatch_finish_map_wave``: for each child, 0033's statements in
0033's order and fences (the child run locked, a running, uncounted map
child; no other step in its run; its set with no child left to admit; the
step's claim), without the count; then the wave's finish
(``django_dispatch_finish_wave``, or ``django_dispatch_finish_keyed_wave``
when ``p_keys`` is not NULL). So each child's run and step rows are locked
before any job row, as a run's cancel locks them (steps, then jobs), and a
child's success commits with its job's. ``mapped``: one ``[run, parent
step, parent run, set]`` per child written; a child not written (a fence did
not match, or the general path must decide) is left running for the caller.

``django_dispatch_map_count_many``: 0031's count, ``map_done + p_count``; its
commit does not wait for the WAL flush (the children it counts are
committed and flushed already; a count lost to a crash is repaired by the
sweep, as 0031's).

The texts are frozen here: a change needs a migration that replaces them.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION django_dispatch_finish_map_wave(
    p_ids bigint[], p_workers text[], p_epochs bigint[], p_values jsonb[],
    p_metered boolean[], p_walls float8[], p_cpus float8[], p_rss float8[],
    p_host text, p_outcome text, p_keys text[], p_namespace text, p_channel text,
    p_runs bigint[], p_steps bigint[], p_claims text[], p_outputs jsonb[],
    OUT won bigint[], OUT freed text[], OUT mapped jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    child record;
BEGIN
    mapped := '[]'::jsonb;
    FOR i IN 1 .. coalesce(cardinality(p_runs), 0) LOOP
        SELECT r.parent_task_id, r.parent_run_id, r.map_batch INTO child
        FROM django_dispatch_workflowrun AS r
        WHERE r.id = p_runs[i] AND r.state = 'running' AND NOT r.map_counted
          AND r.map_batch IS NOT NULL AND r.parent_task_id IS NOT NULL
        FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        CONTINUE WHEN EXISTS (SELECT 1 FROM django_dispatch_workflowtask AS o
                              WHERE o.run_id = p_runs[i] AND o.id <> p_steps[i])
            OR EXISTS (SELECT 1 FROM django_dispatch_workflowtask AS p
                       WHERE p.id = child.parent_task_id AND p.state = 'waiting'
                         AND p.map_batch = child.map_batch AND p.map_started < p.map_total);
        UPDATE django_dispatch_workflowtask
        SET state = 'succeeded', output = p_outputs[i], claim_id = NULL,
            finished_at = statement_timestamp(), updated_at = statement_timestamp()
        WHERE id = p_steps[i] AND claim_id = p_claims[i] AND state = 'running'
          AND run_id = p_runs[i];
        CONTINUE WHEN NOT FOUND;
        UPDATE django_dispatch_workflowrun
        SET state = 'succeeded', output = p_outputs[i], finished_at = statement_timestamp(),
            updated_at = statement_timestamp(), map_counted = true
        WHERE id = p_runs[i];
        mapped := mapped || jsonb_build_array(jsonb_build_array(
            p_runs[i], child.parent_task_id, child.parent_run_id, child.map_batch));
    END LOOP;
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

CREATE OR REPLACE FUNCTION django_dispatch_map_count_many(
    p_step bigint, p_batch text, p_count integer)
RETURNS TABLE (done integer, total integer)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    UPDATE django_dispatch_workflowtask
    SET map_done = map_done + p_count, updated_at = now()
    WHERE id = p_step AND state = 'waiting' AND map_batch = p_batch
    RETURNING map_done::integer, map_total::integer;
END;
$$;
"""
DROP = """
DROP FUNCTION IF EXISTS django_dispatch_finish_map_wave(
    bigint[], text[], bigint[], jsonb[], boolean[], float8[], float8[], float8[], text, text,
    text[], text, text, bigint[], bigint[], text[], jsonb[]);
DROP FUNCTION IF EXISTS django_dispatch_map_count_many(bigint, text, integer);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0035_wave_step_claims")]
    operations = [migrations.RunPython(create, drop)]
