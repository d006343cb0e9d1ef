"""On PostgreSQL, a step's claim and a one-step ``ctx.map`` child's success
as functions.

Sent as statements, these (``store.workflows.pgpath``) cost the server more
to plan than to run: about 0.6 ms of planning per child for the success at
10,000 children, 0.25 ms for the claim, every one of them, because each
mention of the step and run tables makes the planner weigh each of their
partial indexes. A PL/pgSQL function's statements are planned once per
server session and then reused (each is a lookup by primary key, so the
generic plan is the plan), and the function call is a plain statement, so it
passes PgBouncer in transaction mode as any other.

``django_dispatch_step_claim_ready``: the claim of a ready step by the job
entrusted with it, for its generation, returning what the attempt reads of
the step and its run (``pgpath.STEP_FIELDS``, then ``RUN_FIELDS``).

``django_dispatch_map_child_succeed``, in this order (the lock order of every
run transition: the run, then its step): lock the child run while it is a
running map child not counted yet; give up, writing nothing, when the run
has another step or its set still has held children to admit (both need the
general path); the step's success under its claim fence; the run's success,
counted once (``map_counted``). Each statement reads what the ones before it
wrote, as in a transaction of separate statements. The count on the parent
step follows the commit, in a statement of its own (``common.count_map_child``).
The text is frozen here: a change needs a migration that replaces the
function.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION django_dispatch_step_claim_ready(
    p_step bigint, p_generation integer, p_job bigint, p_claim text)
RETURNS TABLE (o_run_id bigint, o_name text, o_handler_path text, o_generation integer,
               o_attempts integer, o_failures integer, o_max_attempts integer, o_backoff jsonb,
               o_timeout double precision, o_checkpoint jsonb, o_depends_on jsonb,
               o_waits jsonb, o_run_name text, o_run_input jsonb, o_run_queue_name text,
               o_run_call_context jsonb, o_run_map_batch text)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    UPDATE django_dispatch_workflowtask AS s
    SET state = 'running', claim_id = p_claim, attempts = s.attempts + 1,
        heartbeat_at = statement_timestamp(),
        started_at = COALESCE(s.started_at, statement_timestamp()),
        updated_at = statement_timestamp()
    FROM django_dispatch_workflowrun AS r
    WHERE s.id = p_step AND s.generation = p_generation AND s.job_id = p_job
      AND s.state = 'ready' AND r.id = s.run_id
    RETURNING s.run_id, s.name::text, s.handler_path::text, s.generation, s.attempts,
        s.failures, s.max_attempts, s.backoff, s.timeout, s.checkpoint, s.depends_on, s.waits,
        r.name::text, r.input, r.queue_name::text, r.call_context, r.map_batch::text;
END;
$$;

CREATE OR REPLACE FUNCTION django_dispatch_map_child_succeed(
    p_run bigint, p_step bigint, p_claim text, p_output jsonb)
RETURNS TABLE (parent_step bigint, parent_run bigint, batch text, written boolean)
LANGUAGE plpgsql AS $$
DECLARE
    child record;
BEGIN
    SELECT r.parent_task_id, r.parent_run_id, r.map_batch INTO child
    FROM django_dispatch_workflowrun AS r
    WHERE r.id = p_run AND r.state = 'running' AND NOT r.map_counted
      AND r.map_batch IS NOT NULL AND r.parent_task_id IS NOT NULL
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    parent_step := child.parent_task_id;
    parent_run := child.parent_run_id;
    batch := child.map_batch;
    written := false;
    IF EXISTS (SELECT 1 FROM django_dispatch_workflowtask AS o
               WHERE o.run_id = p_run AND o.id <> p_step)
       OR EXISTS (SELECT 1 FROM django_dispatch_workflowtask AS p
                  WHERE p.id = child.parent_task_id AND p.state = 'waiting'
                    AND p.map_batch = child.map_batch AND p.map_started < p.map_total) THEN
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE django_dispatch_workflowtask
    SET state = 'succeeded', output = p_output, claim_id = NULL,
        finished_at = statement_timestamp(), updated_at = statement_timestamp()
    WHERE id = p_step AND claim_id = p_claim AND state = 'running' AND run_id = p_run;
    IF NOT FOUND THEN
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE django_dispatch_workflowrun
    SET state = 'succeeded', output = p_output, finished_at = statement_timestamp(),
        updated_at = statement_timestamp(), map_counted = true
    WHERE id = p_run;
    written := true;
    RETURN NEXT;
END;
$$;
"""
DROP = """
DROP FUNCTION IF EXISTS django_dispatch_map_child_succeed(bigint, bigint, text, jsonb);
DROP FUNCTION IF EXISTS django_dispatch_step_claim_ready(bigint, integer, bigint, text);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0022_admin_list_indexes")]
    operations = [migrations.RunPython(create, drop)]
