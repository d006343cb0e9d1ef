"""On PostgreSQL, a one-step ``ctx.map`` child's success and its count in one
call, and a step's claim whose commit does not wait for the WAL flush.

Written apart, a map child costs three commits of its own: its step's
claim, its success (``django_dispatch_map_child_succeed``), then its count
on the parent step (``django_dispatch_map_count``), the first two each
waiting for a WAL flush. At thousands of children those round trips and
flushes are most of what a child costs the worker and the server.

``django_dispatch_map_child_finish``: ``django_dispatch_map_child_succeed``'s
statements, in its order (the child run, its step, the run's success), then,
once written, the count on the parent step (``map_done + 1`` while it waits
for the set), returning (done, total) with the rest. All of it commits
together, so a count is never lost apart from its child's success, and
a count that reaches the total finds every other child's success committed
(each committed with its own count, which this one waited for). The commit
does not wait for the WAL flush (``synchronous_commit`` off for the call's
own transaction), so the parent step's row lock, which every child of the set
takes, is not held across an fsync. What that risks is losing the child's
success to a server crash in the next moments, and only together with
everything committed after it: WAL is flushed in order, so the step job's own
success, committed after this one by the worker's next write and waiting for
its flush, makes this durable first. A crash that loses it loses the job's
success too, and the job runs again after its lease expires, as after a worker
lost mid-attempt. A map child's success is only read by its parent's gather,
which commits (and flushes) after reading it.

``django_dispatch_step_claim_ready`` with ``p_lazy``: the claim of 0024, whose
commit, when ``p_lazy``, does not wait for the WAL flush either. A claim lost
to a server crash leaves the step ready for its job, which is itself not
finished (its success is written after the claim, and flushes it): the job's
re-run claims the step again. Only for a call in autocommit (the caller
checks): ``synchronous_commit`` set for the transaction would otherwise apply
to the caller's whole transaction.

The texts are frozen here: a change needs a migration that replaces them.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION django_dispatch_map_child_finish(
    p_run bigint, p_step bigint, p_claim text, p_output jsonb)
RETURNS TABLE (parent_step bigint, parent_run bigint, batch text, written boolean,
               done integer, total integer)
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
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE django_dispatch_workflowtask AS p
    SET map_done = p.map_done + 1, updated_at = now()
    WHERE p.id = child.parent_task_id AND p.state = 'waiting' AND p.map_batch = child.map_batch
    RETURNING p.map_done::integer, p.map_total::integer INTO done, total;
    RETURN NEXT;
END;
$$;

CREATE OR REPLACE FUNCTION django_dispatch_step_claim_ready(
    p_step bigint, p_generation integer, p_job bigint, p_claim text, p_lazy boolean)
RETURNS TABLE (o_run_id bigint, o_name text, o_handler_path text, o_generation integer,
               o_attempts integer, o_failures integer, o_max_attempts integer, o_backoff jsonb,
               o_timeout double precision, o_checkpoint jsonb, o_depends_on jsonb,
               o_waits jsonb, o_run_name text, o_run_input jsonb, o_run_queue_name text,
               o_run_call_context jsonb, o_run_map_batch text)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_lazy THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
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
"""
DROP = """
DROP FUNCTION IF EXISTS django_dispatch_map_child_finish(bigint, bigint, text, jsonb);
DROP FUNCTION IF EXISTS django_dispatch_step_claim_ready(bigint, integer, bigint, text, boolean);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0032_wave_plans_by_id")]
    operations = [migrations.RunPython(create, drop)]
