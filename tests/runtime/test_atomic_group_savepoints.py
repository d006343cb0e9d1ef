"""A group member's savepoint goes with its body's first statement (``store.atomic_group``).

What is counted is what the job thread sends: libpq's own trace of the
connection (``PQtrace``) lists every message to the server, so a savepoint
sent alone shows as a query of its own. Each member's writes are counted as
rows, read from another connection once the group settled.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from psycopg import pq

from django_dispatch.models import Job
from django_dispatch.runtime import atomic_group
from django_dispatch.runtime.atomic_group import AtomicGroup
from django_dispatch.runtime.running import RunningJob
from django_dispatch.runtime.slots import Slots
from django_dispatch.states import JobState
from django_dispatch.store import atomic_group as atomic_group_store
from tests.conftest import postgres_only
from tests.runtime.test_atomic_group import claim, rows
from tests.testapp import atomic_tasks

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

#: A statement in libpq's trace, and its text: a simple query, or the parse
#: of an extended one (a pipeline, ``executemany()``).
_QUERY = re.compile(r'^F\t\d+\t(?:Query\t|Parse\t "[^"]*") "(.*?)"(?: \d+.*)?$', re.DOTALL)


@contextmanager
def traced() -> Iterator[list[str]]:
    """The statements this thread's connection sends meanwhile."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sent: list[str] = []
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            pgconn.untrace()
            os.fsync(trace.fileno())
            trace.seek(0)
            messages = re.split(r"\n(?=[FB]\t)", trace.read())  # a query may span lines
            sent += [m.group(1) for message in messages if (m := _QUERY.match(message.strip()))]


@pytest.fixture
def group() -> AtomicGroup:
    slots = Slots(concurrency=4)
    slots.ran(0.001)  # only short jobs so far: a group may form
    return AtomicGroup("default", slots)


def three_members(how: str, fail: bool) -> list[RunningJob]:
    """Keys ``first``/``middle``/``last`` queued (``middle`` written by ``how``), claimed."""
    atomic_tasks.write_by.enqueue("first", "orm")
    atomic_tasks.write_by.enqueue("middle", how, fail=fail)
    atomic_tasks.write_by.enqueue("last", "orm")
    return claim(3)


def test_a_members_savepoint_rides_its_first_statement(group):
    (first, middle, last) = three_members("orm", fail=False)
    assert group.execute(first).kind == "succeeded"
    with traced() as sent:
        assert group.execute(middle).kind == "succeeded"
    assert len(sent) == 1, sent  # the savepoint and the INSERT, one round trip
    assert sent[0].startswith("SAVEPOINT django_dispatch_member_") and "INSERT" in sent[0]
    assert group.execute(last).kind == "succeeded"
    members, won = group.settle()
    assert won and len(members) == 3
    assert (rows("first"), rows("middle"), rows("last")) == (1, 1, 1)


def test_a_member_that_fails_before_any_statement_sends_nothing(group):
    (first, middle, last) = three_members("none", fail=True)
    assert group.execute(first).kind == "succeeded"
    with traced() as sent:
        assert group.execute(middle).kind == "retry"
    assert sent == []  # no savepoint, and nothing to roll back to
    assert group.execute(last).kind == "succeeded"
    members, won = group.settle()
    assert won and [m.running for m in members] == [first, last]
    assert (rows("first"), rows("last")) == (1, 1)


@pytest.mark.parametrize("how", ["raw", "copy", "many", "composed", "psycopg-transaction"])
@pytest.mark.parametrize("fail", [False, True])
def test_writes_past_djangos_cursor_are_behind_the_members_savepoint(group, how, fail):
    """psycopg's start of a query, or its own command (its ``transaction()``'s
    savepoint), sends the member's savepoint alone, before anything else: a
    savepoint of psycopg's is taken inside it, and released without it."""
    (first, middle, last) = three_members(how, fail=fail)
    assert group.execute(first).kind == "succeeded"
    with traced() as sent:
        assert group.execute(middle).kind == ("retry" if fail else "succeeded")
    assert re.fullmatch(r"SAVEPOINT django_dispatch_member_\d+", sent[0]), sent
    if fail:
        assert sent[-1].startswith("ROLLBACK TO SAVEPOINT django_dispatch_member_")
    assert group.execute(last).kind == "succeeded"
    members, won = group.settle()
    assert won and len(members) == (2 if fail else 3)
    assert (rows("first"), rows("middle"), rows("last")) == (1, 0 if fail else 1, 1)


@pytest.mark.parametrize("how", ["nested", "client-error"])
@pytest.mark.parametrize("fail", [False, True])
def test_a_first_statement_that_carries_no_savepoint_still_writes_behind_one(group, how, fail):
    """A nested ``atomic()``'s own savepoint carries the member's in front of
    it; a statement refused by the client never reached the server, so the
    next one carries the savepoint."""
    (first, middle, last) = three_members(how, fail=fail)
    assert group.execute(first).kind == "succeeded"
    with traced() as sent:
        assert group.execute(middle).kind == ("retry" if fail else "succeeded")
    assert sent[0].startswith("SAVEPOINT django_dispatch_member_"), sent
    assert group.execute(last).kind == "succeeded"
    members, won = group.settle()
    assert won and len(members) == (2 if fail else 3)
    assert (rows("first"), rows("middle"), rows("last")) == (1, 0 if fail else 1, 1)


@pytest.mark.parametrize("how", ["syntax-error", "close", "rollback"])
def test_a_body_that_leaves_no_savepoint_to_return_to_rolls_the_whole_group_back(group, how):
    """A first statement the server refuses whole (it parses a query's every
    statement before running any) takes no savepoint, and leaves the
    transaction failed; a body that closes the connection, or rolls it back
    past Django (then writes in the transaction psycopg begins afresh), ends
    it. Nothing of the group may commit then: the member fails, the others
    go back, and the earlier members' successes are not written without
    their writes."""
    (first, middle, last) = three_members(how, fail=False)
    assert group.execute(first).kind == "succeeded"
    assert group.execute(middle).kind in ("retry", "interrupted")
    assert group.broken and not group.has_room()
    members, won = group.settle()
    assert not won and [m.running for m in members] == [first]
    assert (rows("first"), rows("middle")) == (0, 0)
    assert middle.claimed.id in atomic_group._SOLO
    # The thread carries on: the next job opens a group of its own.
    assert not connection.in_atomic_block
    assert group.execute(last).kind == "succeeded"
    assert group.settle()[1] and rows("last") == 1


def test_a_members_failure_without_its_savepoint_never_reaches_an_earlier_ones(group):
    """Were savepoints to share a name, the failing member's rollback would go
    back to the one before it, undoing that member's writes and keeping its
    success. Each has a name of its own: the rollback fails, the group too."""
    atomic_tasks.write_by.enqueue("first", "orm")
    atomic_tasks.write_by.enqueue("second", "orm")
    atomic_tasks.write_by.enqueue("third", "syntax-error")
    first, second, third = claim(3)
    assert group.execute(first).kind == "succeeded"
    assert group.execute(second).kind == "succeeded"
    assert group.execute(third).kind == "retry"
    members, won = group.settle()
    assert not won and [m.running for m in members] == [first, second]
    assert (rows("first"), rows("second"), rows("third")) == (0, 0, 0)


def test_a_body_that_rolls_back_with_sql_commits_nothing_of_its_group(group):
    """A ``ROLLBACK`` statement passes no hook once the savepoint is taken: the
    member seems to succeed, in a transaction psycopg began afresh. The group's
    commit releases its first savepoint first, which that ROLLBACK took with
    it: nothing commits, not the first member's success without its writes."""
    (first, middle, last) = three_members("sql-rollback", fail=False)
    assert group.execute(first).kind == "succeeded"
    assert group.execute(middle).kind == "succeeded"
    assert group.execute(last).kind == "succeeded"
    members, won = group.settle()
    assert not won and len(members) == 3
    assert (rows("first"), rows("middle"), rows("last")) == (0, 0, 0)
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.RUNNING}


def test_a_body_that_commits_the_raw_connection_fails_and_its_group_commits_no_success(group):
    """psycopg's ``commit()`` is seen: the member fails, saying why, and no
    success of the group is written. What that COMMIT sent is committed, the
    earlier member's writes with it (what the docs warn of)."""
    (first, middle, _last) = three_members("commit", fail=False)
    assert group.execute(first).kind == "succeeded"
    outcome = group.execute(middle)
    assert outcome.kind == "retry" and atomic_group_store.ENDED in str(outcome.exception)
    members, won = group.settle()
    assert not won and [m.running for m in members] == [first]
    assert (rows("first"), rows("middle")) == (1, 1)  # the first row of each, no more
