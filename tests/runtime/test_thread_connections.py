"""A job thread's connection check (``runtime.connections``): skipped only when the
reset that ended the last job left nothing to check, and never after a doubt."""

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections

from django_dispatch.runtime import connections as thread_connections
from django_dispatch.runtime.connections import ThreadConnections, database_went_away

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scans(monkeypatch) -> list[int]:
    """Every scan of this thread's connections, counted."""
    counted: list[int] = []
    real = type(connections).all

    def counting(self, initialized_only=False):
        counted.append(1)
        return real(self, initialized_only=initialized_only)

    monkeypatch.setattr(type(connections), "all", counting)
    return counted


def test_a_clean_reset_proves_the_connection_for_the_next_job_of_a_job_thread(scans):
    conns = ThreadConnections(exclusive=True)
    conns.ready_for_task(DEFAULT_DB_ALIAS)
    conns.end_job(DEFAULT_DB_ALIAS)
    assert conns.proven == DEFAULT_DB_ALIAS
    scans.clear()
    conns.ready_for_task(DEFAULT_DB_ALIAS)
    assert scans == []  # nothing to check: as the reset left it
    assert conns.proven is None  # the next job proves it again
    conns.ready_for_task(DEFAULT_DB_ALIAS)
    assert scans == [1]


def test_a_doubt_makes_the_next_job_check_after_all(scans):
    conns = ThreadConnections(exclusive=True)
    conns.ready_for_task(DEFAULT_DB_ALIAS)
    conns.end_job(DEFAULT_DB_ALIAS)
    database_went_away()  # another thread saw the database fail
    scans.clear()
    conns.ready_for_task(DEFAULT_DB_ALIAS)
    assert scans == [1]

    conns.end_job(DEFAULT_DB_ALIAS)
    conns.last_used -= thread_connections.IDLE_CHECK_SECONDS + 1  # the thread idled
    scans.clear()
    conns.ready_for_task(DEFAULT_DB_ALIAS)
    assert scans == [1]


def test_an_error_or_a_closed_connection_is_never_proven():
    conns = ThreadConnections(exclusive=True)
    conns.ready_for_task(DEFAULT_DB_ALIAS)
    connection.errors_occurred = True  # a task's query failed
    conns.end_job(DEFAULT_DB_ALIAS)
    assert conns.proven is None
    assert connection.errors_occurred is False  # still usable: kept, checked next time

    conns.ready_for_task(DEFAULT_DB_ALIAS)
    connection.close()
    conns.end_job(DEFAULT_DB_ALIAS)
    assert conns.proven is None
    conns.ready_for_task(DEFAULT_DB_ALIAS)
    assert connection.connection is not None  # opened again before task code


def test_health_checks_asked_for_are_never_skipped(monkeypatch):
    conns = ThreadConnections(exclusive=True)
    conns.ready_for_task(DEFAULT_DB_ALIAS)
    monkeypatch.setitem(connection.settings_dict, "CONN_HEALTH_CHECKS", True)
    conns.end_job(DEFAULT_DB_ALIAS)
    assert conns.proven is None


def test_a_thread_that_runs_other_code_between_jobs_always_checks():
    """The asyncio executor's sync thread runs tasks' database calls between jobs."""
    conns = ThreadConnections()
    conns.ready_for_task(DEFAULT_DB_ALIAS)
    conns.end_job(DEFAULT_DB_ALIAS)
    assert conns.proven is None
