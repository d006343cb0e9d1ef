"""The follow-up thread (``runtime.followups``): a connection cut under it is
replaced, so a worker's later map counts are not all left to the sweep."""

import threading

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections

from django_dispatch.runtime.followups import FollowUps
from tests.conftest import postgres_only

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]


def _backend_pid() -> int:
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _run_all(followups: FollowUps, *actions) -> None:
    done = threading.Event()
    followups.put([*actions, done.set])
    assert done.wait(10), "the follow-up thread did not run its actions"


def test_an_action_whose_connection_was_cut_runs_again_on_a_new_one(caplog):
    followups = FollowUps(DEFAULT_DB_ALIAS)
    try:
        pids: list[int] = []
        _run_all(followups, lambda: pids.append(_backend_pid()))
        with connection.cursor() as cursor:  # the test's own connection cuts the thread's
            cursor.execute("SELECT pg_terminate_backend(%s)", [pids[0]])
        _run_all(followups, lambda: pids.append(_backend_pid()))
        _run_all(followups, lambda: pids.append(_backend_pid()))
    finally:
        followups.stop()
    assert len(pids) == 3  # the cut action ran once more, and the next one as well
    assert pids[1] != pids[0] and pids[2] == pids[1]  # one new connection, then kept
    assert "follow-up failed" not in caplog.text


def test_an_action_whose_statement_fails_is_logged_not_repeated_and_the_next_one_runs(caplog):
    followups = FollowUps(DEFAULT_DB_ALIAS)
    calls: list[str] = []

    def broken() -> None:
        calls.append("broken")
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table_here")

    try:
        _run_all(followups, broken, lambda: calls.append(str(_backend_pid())))
    finally:
        followups.stop()
    assert calls[0] == "broken" and calls[1].isdigit() and len(calls) == 2
    assert caplog.text.count("follow-up failed") == 1
