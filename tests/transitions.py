"""Test-only PostgreSQL triggers that reject any state change not in its table.

``core.states.TRANSITIONS`` is the one table of allowed job state changes
(``core.workflow_states`` has the runs' and the steps'). The store
is the only writer, but its statements are many (ORM updates, raw SQL on the
hot path); rather than trust each, the whole suite runs with this trigger on
the job table, generated from the table itself: a transition the table does
not list raises inside the statement that tried it, in the test process or in
any worker process the test started.

It also rejects a job blocked without a reason the live counts can see: a
partition key, a concurrency key or a queue's limit (``flow_queue``). The
counts of live jobs read blocked jobs through those three partial indexes
only (``store.base.LIVE_JOBS_BY_STATE``); a job blocked without any of them
would silently drop out of the gauges, ``dispatch_status`` and the console.
"""

from __future__ import annotations

import pytest
from django.db import connection

FUNCTION = "dispatch_test_check_transition"
TRIGGER = "dispatch_test_transitions"


def allowed_pairs() -> list[tuple[str, str]]:
    from django_dispatch.core.states import TRANSITIONS  # imported late: a pytest plugin

    return sorted((str(src), str(dst)) for src, dsts in TRANSITIONS.items() for dst in dsts)


def _pairs(table: dict) -> str:
    return ", ".join(
        f"('{src}', '{dst}')"
        for src, dst in sorted((str(s), str(d)) for s, ds in table.items() for d in ds)
    )


def install_workflow_guards() -> None:
    """The same guard on the workflow run and step tables, from their tables."""
    from django_dispatch.core.workflow_states import RUN_TRANSITIONS, STEP_TRANSITIONS
    from django_dispatch.models import WorkflowRun, WorkflowTask

    for model, table, what in (
        (WorkflowRun, RUN_TRANSITIONS, "run"),
        (WorkflowTask, STEP_TRANSITIONS, "step"),
    ):
        name = connection.ops.quote_name(model._meta.db_table)
        function, trigger = f"{FUNCTION}_{what}", f"{TRIGGER}_{what}"
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                CREATE OR REPLACE FUNCTION {function}() RETURNS trigger AS $$
                BEGIN
                    IF (OLD.state, NEW.state) NOT IN ({_pairs(table)}) THEN
                        RAISE EXCEPTION '{what} %: transition % -> % is not in its table',
                            OLD.id, OLD.state, NEW.state;
                    END IF;
                    RETURN NEW;
                END $$ LANGUAGE plpgsql
                """
            )
            cursor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {name}")
            cursor.execute(
                f"CREATE TRIGGER {trigger} BEFORE UPDATE OF state ON {name} FOR EACH ROW "
                f"WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION {function}()"
            )


def install() -> None:
    """Create (or replace) the trigger on the job table of the current database."""
    from django_dispatch.models import Job

    table = connection.ops.quote_name(Job._meta.db_table)
    pairs = ", ".join(f"('{src}', '{dst}')" for src, dst in allowed_pairs())
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger AS $$
            BEGIN
                IF (OLD.state, NEW.state) NOT IN ({pairs}) THEN
                    RAISE EXCEPTION 'job %: transition % -> % is not in states.TRANSITIONS',
                        OLD.id, OLD.state, NEW.state;
                END IF;
                IF NEW.state = 'blocked' AND NEW.partition_key IS NULL
                        AND NEW.concurrency_key IS NULL AND NEW.flow_queue IS NULL THEN
                    RAISE EXCEPTION 'job %: blocked without a partition key, a concurrency '
                        'key or a flow_queue: store.base.LIVE_JOBS_BY_STATE cannot count it',
                        NEW.id;
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql
            """
        )
        cursor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {table}")
        cursor.execute(
            f"CREATE TRIGGER {TRIGGER} BEFORE UPDATE OF state ON {table} FOR EACH ROW "
            f"WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION {FUNCTION}()"
        )


@pytest.fixture(scope="session", autouse=True)
def transition_guard(django_db_setup, django_db_blocker):
    """Install the guard once the test database exists (PostgreSQL only)."""
    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock():
        # Without a test that needs the database, no test database was made
        # and this is the developer's own: leave it alone.
        from django_dispatch.models import Job

        if Job._meta.db_table in connection.introspection.table_names():
            install()
            install_workflow_guards()
