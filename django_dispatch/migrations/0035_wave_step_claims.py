"""On PostgreSQL, the claim of the steps of the step jobs a worker's wave leases,
in the wave's own statement (``store.workflows.preclaim``).

A step job's first statement is its step's claim. Sent by the job itself it
is a round trip, a commit and a statement's worth of worker CPU per step; at
thousands of ``ctx.map`` children those are a large part of what a child
costs. Claimed in the wave that leases the jobs, the steps' claims commit
with the leases, for the whole wave in one statement.

``django_dispatch_wave_step_claims``: ``django_dispatch_step_claim_ready``'s
claim (0033) for several steps, each with a claim id of its own (32 hex
digits, as ``secrets.token_hex(16)``), fenced the same way (the job entrusted
with the step, the step's generation, ``ready``). The wave holds its jobs'
row locks when this runs, so it must never wait for a step's lock: a
transaction that holds a step row and then writes its job (a run's cancel)
would deadlock with it. A step row another transaction holds is skipped
(``SKIP LOCKED``), and its job claims it itself, as any step job does, after
the wave has committed.

One step at a time, each by its primary key, in plans made once per server
session: written as one join of the arrays with the step and run tables, it
took about 37 ms a call in a drain of 10,000 children (pg_stat_statements),
more than the round trips it saves.

The text is frozen here: a change needs a migration that replaces it.
"""

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
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_jobs), 0) LOOP
        PERFORM 1 FROM django_dispatch_workflowtask AS s
        WHERE s.id = p_steps[i] AND s.generation = p_generations[i] AND s.job_id = p_jobs[i]
          AND s.state = 'ready'
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        RETURN QUERY
        UPDATE django_dispatch_workflowtask AS s
        SET state = 'running', claim_id = replace(gen_random_uuid()::text, '-', ''),
            attempts = s.attempts + 1,
            heartbeat_at = statement_timestamp(),
            started_at = COALESCE(s.started_at, statement_timestamp()),
            updated_at = statement_timestamp()
        FROM django_dispatch_workflowrun AS r
        WHERE s.id = p_steps[i] AND r.id = s.run_id
        RETURNING p_jobs[i], s.id, s.claim_id::text,
            s.run_id, s.name::text, s.handler_path::text, s.generation, s.attempts,
            s.failures, s.max_attempts, s.backoff, s.timeout, s.checkpoint, s.depends_on,
            s.waits, r.name::text, r.input, r.queue_name::text, r.call_context,
            r.map_batch::text;
    END LOOP;
END;
$$;
"""
DROP = """
DROP FUNCTION IF EXISTS django_dispatch_wave_step_claims(bigint[], bigint[], integer[]);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0034_drop_admin_list_indexes")]
    operations = [migrations.RunPython(create, drop)]
