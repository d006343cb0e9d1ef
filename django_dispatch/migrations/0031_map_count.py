"""On PostgreSQL, a ``ctx.map`` child's count on its parent step as a function.

Sent as a statement (``store.workflows.pgpath``), the count was planned at
every child, the planner weighing each partial index of the step table:
about as much server time as its execution (0.23 of 0.52 ms per child at
10,000 children, pg_stat_statements with planning). A PL/pgSQL function's
statement is planned once per server session (a lookup by primary key: the
generic plan is the plan).

``django_dispatch_map_count``: ``map_done + 1`` on the step while it waits
for the set ``p_batch``, returning (done, total), no row when it no longer
waits. It writes ``map_done`` and ``updated_at`` only, no indexed column, so
the update is HOT; its transaction's commit does not wait for the WAL flush
(``synchronous_commit`` off for that transaction only), so the step row's
lock is not held across an fsync: a count lost to a server crash is repaired
by the sweep, the child's success having committed and been flushed before.
Called in autocommit: the call is its own transaction. The text is frozen
here: a change needs a migration that replaces the function.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION django_dispatch_map_count(p_step bigint, p_batch text)
RETURNS TABLE (done integer, total integer)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    UPDATE django_dispatch_workflowtask
    SET map_done = map_done + 1, updated_at = now()
    WHERE id = p_step AND state = 'waiting' AND map_batch = p_batch
    RETURNING map_done::integer, map_total::integer;
END;
$$;
"""
DROP = "DROP FUNCTION IF EXISTS django_dispatch_map_count(bigint, text);"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0030_keyed_wave")]
    operations = [migrations.RunPython(create, drop)]
