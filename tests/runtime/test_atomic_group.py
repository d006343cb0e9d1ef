"""Atomic jobs run back to back on one job thread share one transaction (``runtime.atomic_group``).

A group is driven here as a job thread drives it, on the test's own
connection, against a real PostgreSQL: what another connection sees is read
from another thread. The last test drains through a real worker process.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.db.models import Count, F
from psycopg import IsolationLevel, pq

from django_dispatch import store
from django_dispatch.compat import task_started
from django_dispatch.models import Job, JobUsage
from django_dispatch.runtime import metering, outcomes
from django_dispatch.runtime.atomic_group import (
    CONTENDED,
    MAX_MEMBERS,
    WAIT_SECONDS,
    AtomicGroup,
)
from django_dispatch.runtime.running import RunningJob
from django_dispatch.runtime.slots import Slots
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from tests.conftest import postgres_only, wait_until
from tests.testapp import atomic_tasks
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]


def elsewhere[T](read: Callable[[], T]) -> T:
    """``read()`` on a thread of its own: another connection, outside the group's transaction."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(read())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


def _count(sql: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def rows(key: str) -> int:
    return elsewhere(lambda: SideEffect.objects.filter(key=key).count())


def claim(count: int) -> list[RunningJob]:
    """The queue's ``count`` jobs, leased as a worker's claim leases them, in enqueue order."""
    claimed = store.jobs_claim(worker_id="w-group", queues=(), limit=count, lease_seconds=30)
    assert len(claimed) == count
    runs = [RunningJob(claimed=c, lease_seconds=30) for c in sorted(claimed, key=lambda c: c.id)]
    for running in runs:
        metering.start(running.claimed.id, thread_cpu=True)
    return runs


@pytest.fixture
def group() -> AtomicGroup:
    slots = Slots(concurrency=4)
    slots.ran(0.001)  # only short jobs so far: a group may form
    return AtomicGroup("default", slots)


def test_members_commit_their_writes_and_successes_together_at_the_end(group):
    for key in ("g1", "g2", "g3"):
        atomic_tasks.write_rows.enqueue(key)
    runs = claim(3)
    for running in runs:
        assert group.accepts(running)
        assert group.execute(running).kind == "succeeded"
        assert running.grouped
    # Nothing is visible before the group's commit, to another connection.
    assert [rows(k) for k in ("g1", "g2", "g3")] == [0, 0, 0]
    states = elsewhere(lambda: set(Job.objects.values_list("state", flat=True)))
    assert states == {JobState.RUNNING}
    members, won = group.settle()
    assert won and [m.running for m in members] == runs
    assert [rows(k) for k in ("g1", "g2", "g3")] == [2, 2, 2]
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert Job.objects.values("finished_at").distinct().count() == 1  # one statement
    assert JobUsage.objects.filter(outcome="succeeded").count() == 3
    assert not group.open and not connection.in_atomic_block


def test_a_member_that_raises_is_undone_alone_and_loses_its_on_commit_callbacks(group):
    atomic_tasks.COMMITTED.clear()
    atomic_tasks.write_with_hook.enqueue("kept-1")
    atomic_tasks.write_with_hook.enqueue("undone", fail=True)
    atomic_tasks.write_with_hook.enqueue("kept-2")
    first, failing, last = claim(3)
    assert group.execute(first).kind == "succeeded"
    outcome = group.execute(failing)
    assert outcome.kind == "retry" and not failing.grouped
    assert group.execute(last).kind == "succeeded" and last.grouped
    members, won = group.settle()
    assert won and [m.running for m in members] == [first, last]
    assert (rows("kept-1"), rows("undone"), rows("kept-2")) == (1, 0, 1)
    assert atomic_tasks.COMMITTED == []  # run once the members are ended
    group.run_callbacks()
    assert atomic_tasks.COMMITTED == ["kept-1", "kept-2"]


def test_a_lost_lease_rolls_the_whole_group_back_and_the_others_go_back_unspent(group):
    atomic_tasks.write_rows.enqueue("innocent")
    atomic_tasks.write_rows.enqueue("stolen")
    innocent, stolen = claim(2)
    for running in (innocent, stolen):
        assert group.execute(running).kind == "succeeded"
    elsewhere(
        lambda: Job.objects.filter(pk=stolen.claimed.id).update(lease_epoch=F("lease_epoch") + 1)
    )
    members, won = group.settle()
    assert not won and len(members) == 2
    assert (rows("innocent"), rows("stolen")) == (0, 0)
    assert outcomes.release(innocent.claimed, why="test") is True
    assert not outcomes.release(stolen.claimed, why="test")  # not ours any more: left alone
    back = Job.objects.get(pk=innocent.claimed.id)
    assert (back.state, back.attempts) == (JobState.PENDING, 0)
    assert Job.objects.get(pk=stolen.claimed.id).state == JobState.RUNNING
    assert not JobUsage.objects.exists()


def test_bodies_that_write_nothing_open_no_transaction(group):
    for key in ("n1", "n2", "n3"):
        atomic_tasks.atomic_noop.enqueue(key)
    runs = claim(3)
    for running in runs:
        assert group.execute(running).kind == "succeeded"
    status = connection.connection.pgconn.transaction_status
    assert status == pq.TransactionStatus.IDLE  # no BEGIN, no savepoint sent
    members, won = group.settle()
    assert won and len(members) == 3
    assert list(Job.objects.values_list("return_value", flat=True).order_by("id")) == [
        "n1",
        "n2",
        "n3",
    ]


def test_a_forsaken_group_commits_nothing(group):
    atomic_tasks.write_rows.enqueue("forsaken")
    (running,) = claim(1)
    assert group.execute(running).kind == "succeeded"
    assert [m.running for m in group.forsake()] == [running]
    assert group.settle() == ([], False)
    assert rows("forsaken") == 0
    assert Job.objects.get(pk=running.claimed.id).state == JobState.RUNNING


def test_a_group_takes_neither_more_than_its_bound_nor_keyed_nor_plain_jobs(group):
    for i in range(MAX_MEMBERS + 1):
        atomic_tasks.atomic_noop.enqueue(f"b{i}")
    runs = claim(MAX_MEMBERS + 1)
    for running in runs[:MAX_MEMBERS]:
        assert group.accepts(running)
        group.execute(running)
    assert not group.accepts(runs[-1])
    assert group.eligible(runs[-1])  # its thread settles this group and opens the next
    assert group.settle()[1]
    assert group.accepts(runs[-1])
    atomic_tasks.atomic_noop.using(partition_key="k").enqueue("keyed")
    atomic_tasks.effect_plain.enqueue("plain")
    assert not any(group.accepts(r) for r in claim(2))
    slow = AtomicGroup("default", Slots(concurrency=1))  # no job has run: none is known short
    atomic_tasks.atomic_noop.enqueue("first")
    assert not slow.accepts(claim(1)[0])


def test_a_worker_drains_grouped_atomic_jobs_with_failures_among_them_exactly(start_worker):
    """Through a real worker: every key ends with exactly its rows, and some jobs
    were finished together (one statement: one ``finished_at``), so groups formed."""
    keys = [f"drain-{i}" for i in range(240)]
    for i, key in enumerate(keys):
        if i % 4 == 3:
            atomic_tasks.write_with_hook.enqueue(key, fail=i % 8 == 3)
        else:
            atomic_tasks.write_rows.enqueue(key, rows=1)
    worker = start_worker("--burst", "--concurrency", "4")
    assert worker.wait() == 0, worker.output()
    counts = dict(
        SideEffect.objects.values_list("key").annotate(n=Count("id")).values_list("key", "n")
    )
    failing = {key for i, key in enumerate(keys) if i % 8 == 3}
    assert {k: counts.get(k, 0) for k in keys} == {k: 0 if k in failing else 1 for k in keys}
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == len(keys) - len(failing)
    assert Job.objects.filter(state=JobState.FAILED).count() == len(failing)
    shared = Job.objects.values("finished_at").annotate(n=Count("id")).filter(n__gt=1)
    assert shared.exists(), worker.output()


def test_a_thread_given_up_on_hands_back_the_successes_waiting_in_its_group(
    settings, tmp_path, caplog
):
    """A job over its timeout whose thread is given up on (no recycling in an
    in-process drain): the members waiting in that thread's group would wait
    for its stuck body; they go back to the queue and run again elsewhere,
    once each, and the drain ends while the stuck body still runs."""
    settings.DISPATCH = {**settings.DISPATCH, "TIMEOUT_GRACE": 0.2}
    keys = [f"before-{i}" for i in range(6)]
    for key in keys:
        atomic_tasks.write_rows.enqueue(key, rows=1)
    done = tmp_path / "hang-ended"
    hung = atomic_tasks.hang_ignoring_stop.enqueue("hung", seconds=15, done=str(done))
    with caplog.at_level("INFO", logger="django_dispatch"):
        drain(concurrency=1)
    assert not done.exists()  # the drain did not wait for the stuck body
    assert [rows(key) for key in keys] == [1] * len(keys)
    assert set(Job.objects.exclude(pk=hung.id).values_list("state", flat=True)) == {
        JobState.SUCCEEDED
    }
    assert Job.objects.get(pk=hung.id).state == JobState.FAILED
    assert rows("hung") == 0
    # The stuck body's transaction was ended on the server: its locks are gone.
    open_elsewhere = elsewhere(
        lambda: _count(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state LIKE 'idle in transaction%%'"
        )
    )
    assert open_elsewhere == 0
    released = [r.getMessage() for r in caplog.records if "group of atomic jobs" in r.getMessage()]
    assert released, "no success waited in the given-up thread's group: the test tested nothing"


def test_a_commit_refused_for_a_members_writes_runs_each_member_alone_next(group):
    """A deferred constraint fails the group's COMMIT, and nothing says which
    member broke it: each goes back unspent and runs alone next time, where the
    culprit fails as a lone atomic job does (no member loops back for ever)."""
    with connection.cursor() as cursor:
        cursor.execute(atomic_tasks.ORPHANS_SQL)
    atomic_tasks.write_rows.enqueue("innocent", rows=1)
    atomic_tasks.write_orphan.enqueue("orphan")
    innocent, orphan = claim(2)
    assert group.execute(innocent).kind == "succeeded"
    assert group.execute(orphan).kind == "succeeded"  # the key is checked at COMMIT
    members, won = group.settle()
    assert not won and len(members) == 2 and not connection.in_atomic_block
    assert (rows("innocent"), rows("orphan")) == (0, 0)
    for running in (innocent, orphan):
        assert outcomes.release(running.claimed, why="test")
        assert not group.accepts(running)  # alone, once
        assert group.accepts(running)
    drain(concurrency=1)
    assert Job.objects.get(pk=innocent.claimed.id).state == JobState.SUCCEEDED
    failed = Job.objects.get(pk=orphan.claimed.id)
    assert (failed.state, failed.attempts) == (JobState.FAILED, 1)
    assert "IntegrityError" in failed.errors[-1]["exception_class_path"]
    assert (rows("innocent"), rows("orphan")) == (1, 0)


def test_a_task_started_receiver_keeps_its_task_out_of_groups(group):
    """A site's ``task_started`` receiver runs before the body: in a group it
    would write inside the group's transaction, so such a task runs alone."""

    def receiver(sender, task_result, **kwargs):
        """Could write rows of its own."""

    atomic_tasks.write_rows.enqueue("observed")
    (running,) = claim(1)
    task_started.connect(receiver)
    try:
        assert not group.accepts(running)
    finally:
        task_started.disconnect(receiver)
    assert group.accepts(running)


def test_a_group_waits_for_a_next_job_only_while_a_backlog_is_queued(group):
    atomic_tasks.atomic_noop.enqueue("first")
    (running,) = claim(1)
    group.execute(running)
    group.slots.backlog = False
    assert group.patience() == 0.0
    group.slots.backlog = True
    assert 0.0 < group.patience() <= WAIT_SECONDS
    assert group.settle()[1]


def test_a_body_whose_outcome_cannot_be_told_keeps_nothing(group):
    """The body returned, but classifying its value raised: its writes are
    undone before the error goes on, and the group commits nothing of it."""
    atomic_tasks.write_then_return_too_deep.enqueue("too-deep")
    (running,) = claim(1)
    with pytest.raises(RecursionError):
        group.execute(running)
    assert not running.grouped
    assert group.settle() == ([], False)
    assert rows("too-deep") == 0


def test_groups_form_only_at_read_committed(group):
    atomic_tasks.atomic_noop.enqueue("level")
    (running,) = claim(1)
    assert group.accepts(running)
    connection.isolation_level = IsolationLevel.REPEATABLE_READ
    try:
        assert not group.accepts(running)
    finally:
        connection.isolation_level = IsolationLevel.READ_COMMITTED


def test_successes_waiting_behind_a_body_that_turned_out_long_go_back_while_it_runs(
    tmp_path, caplog
):
    """A group's member whose body runs long (no timeout): the success waiting
    before it goes back unspent once it has waited ``MAX_WAIT_SECONDS``, its
    writes rolled back and their locks gone (the transaction is ended on the
    server) while the long body still runs; that body's job goes back unspent
    too, runs again, and every key ends with its rows exactly once.

    One thread: the first job runs alone (no job's length is known yet), and
    the next claim brings the other two at once, so ``waiting`` opens a group
    and ``long`` joins it straight from the thread's inbox."""
    first = atomic_tasks.write_rows.enqueue("first", rows=1)
    waiting = atomic_tasks.write_rows.enqueue("waiting", rows=1)
    signal, release = tmp_path / "signal", tmp_path / "release"
    long = atomic_tasks.write_and_wait.enqueue("long", str(signal), str(release))
    seen: list[str] = []

    def handed_back() -> list[str]:
        return [
            r.getMessage()
            for r in list(caplog.records)
            if f"job {waiting.id} " in r.getMessage() and "given up on" in r.getMessage()
        ]

    def watch() -> None:
        """While the long body waits: the waiting success handed back, and the
        group's transaction (its row, the body's first) ended on the server."""
        try:
            deadline = time.monotonic() + 20
            while not signal.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            while time.monotonic() < deadline and not (handed_back() and not open_elsewhere()):
                time.sleep(0.02)
            seen.extend(handed_back() if not open_elsewhere() else [])
        finally:
            release.touch()
            connections.close_all()

    def open_elsewhere() -> int:
        return _count(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state LIKE 'idle in transaction%%'"
        )

    watcher = threading.Thread(target=watch)
    watcher.start()
    with caplog.at_level("INFO", logger="django_dispatch"):
        drain(concurrency=1)
    watcher.join()
    assert seen, "the waiting success was not handed back while the long body ran"
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"job {long.id} " in m and "given up on" in m for m in messages)  # it too
    assert (rows("first"), rows("waiting"), rows("long")) == (1, 1, 2)  # "before", "after"
    jobs = {str(j.pk): j for j in Job.objects.all()}
    assert {j.state for j in jobs.values()} == {JobState.SUCCEEDED}
    assert [jobs[j.id].attempts for j in (first, waiting, long)] == [1, 1, 1]  # none spent


def test_a_member_failed_by_a_deadlock_goes_back_unspent_and_runs_alone_next(group):
    """A member deadlocks against another session on a row the group's earlier
    member locked: the server fails the member's statement, the member goes
    back unspent (its group held the lock, not its own code), and runs alone
    next time, where a deadlock of its own then costs an attempt."""
    x = SideEffect.objects.create(key="x", note="")
    y = SideEffect.objects.create(key="y", note="")
    atomic_tasks.touch_row.enqueue(x.pk)
    atomic_tasks.touch_row.enqueue(y.pk)
    first, second = claim(2)
    assert group.execute(first).kind == "succeeded"  # x locked in the group's transaction
    y_locked = threading.Event()

    def other() -> None:
        try:
            with transaction.atomic():
                SideEffect.objects.filter(pk=y.pk).update(note="other")
                y_locked.set()
                time.sleep(0.3)  # the member waits first: its own server process finds the cycle
                SideEffect.objects.filter(pk=x.pk).update(note="other")
        finally:
            connections.close_all()

    session = threading.Thread(target=other)
    session.start()
    assert y_locked.wait(10)
    outcome = group.execute(second)
    assert (outcome.kind, outcome.why) == ("released", CONTENDED)
    assert not group.eligible(second)  # runs alone next time
    members, won = group.settle()
    assert won and [m.running for m in members] == [first]
    session.join(10)
    assert not session.is_alive()


@pytest.mark.slow
def test_a_restart_for_a_timed_out_member_does_not_wait_for_its_group(start_worker, tmp_path):
    """Under ``rundispatch``, a member past its timeout that ignores the stop makes
    the process restart itself once the jobs beside it are done; the success
    waiting in its group could only be settled by its stuck thread. It goes
    back after about a second instead, so the restart does not wait out the
    shutdown timeout (60 s here), and it runs again, once."""
    atomic_tasks.write_rows.enqueue("alone", rows=1)  # no job's length known yet: alone
    waiting = atomic_tasks.write_rows.enqueue("waiting", rows=1)
    done = tmp_path / "hang-ended"
    hung = atomic_tasks.hang_ignoring_stop.enqueue("hung", seconds=60, done=str(done))
    worker = start_worker(
        "--concurrency", "1", "--shutdown-timeout", "60",
        overrides={"TIMEOUT_GRACE": 0.2, "LEASE_SECONDS": 10.0},
    )  # fmt: skip
    wait_until(
        lambda: Job.objects.get(pk=waiting.id).state == JobState.SUCCEEDED,
        timeout=20,
        what="the waiting success to run again after the restart",
    )
    log = worker.output()
    assert "recycling the worker process" in log, log
    assert f"job {waiting.id} " in log and "given up on" in log, log
    assert not done.exists()
    assert (rows("alone"), rows("waiting"), rows("hung")) == (1, 1, 0)
    assert Job.objects.get(pk=hung.id).state == JobState.FAILED  # its timeout, one attempt
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
