"""An atomic job's success sent with its COMMIT (PostgreSQL): the fence still decides.

``job_commit_success_if_leased`` commits the transaction it is called in, in
the same round trip as its fenced UPDATE; a fence that matches no row must
stop that COMMIT, whether the body wrote (a transaction open) or not (the
statement alone, its own transaction). Each case is checked from the
database afterwards: the body's row, the job's state, the usage record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_dispatch import store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job, JobUsage
from django_dispatch.runtime.connections import lost_connection
from django_dispatch.store.atomic_finish import fast_path_available, job_commit_success_if_leased
from django_dispatch.store.types import Lease
from django_dispatch.store.usage import UsageEntry
from tests.conftest import ON_POSTGRES, TEST_DB, postgres_only
from tests.server_activity import last_query
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "w-atomic"


def _running() -> store.ClaimedJob:
    tasks.add.using(queue_name="atomic-q").enqueue(1, 2)
    (claimed,) = store.jobs_claim(worker_id=WORKER, queues=("atomic-q",), limit=1, lease_seconds=30)
    return claimed


def _usage(claimed: store.ClaimedJob) -> UsageEntry:
    """The record as ``metering.entry`` makes it: what the row knows, from the claim."""
    return UsageEntry(
        job_id=claimed.id,
        namespace=claimed.lease.namespace,
        task_path=claimed.row["task_path"],
        queue_name=claimed.row["queue_name"],
        attempt=claimed.row["attempts"],
        worker_id=WORKER,
        host="host-1",
        outcome="succeeded",
        started_at=claimed.claimed_at,
        wall_seconds=0.25,
        cpu_seconds=None,
        peak_rss_mb=61.5,
        resources=claimed.row.get("resources"),
    )


def _commit(lease: Lease, value, usage, *, write: bool, hooks: list[str]) -> tuple[bool, bool]:
    """The atomic job's transaction: (won, whether the block left by rollback)."""
    rolled_back = False
    won = False
    try:
        with transaction.atomic():
            if write:
                SideEffect.objects.create(key="k", note="body")
            transaction.on_commit(lambda: hooks.append("committed"))
            won = job_commit_success_if_leased(lease, value, usage, db="default")
            if not won:
                raise LookupError
    except LookupError:
        rolled_back = True
    return won, rolled_back


@postgres_only
@pytest.mark.parametrize("write", [True, False], ids=["body-wrote", "body-wrote-nothing"])
def test_a_won_fence_commits_the_body_the_success_and_its_record_in_one_round_trip(write):
    claimed = _running()
    hooks: list[str] = []
    with CaptureQueriesContext(connection) as queries:
        won, rolled_back = _commit(
            claimed.lease, {"total": 3}, _usage(claimed), write=write, hooks=hooks
        )
    assert (won, rolled_back, hooks) == (True, False, ["committed"])
    # Through Django's cursor only the body's INSERT (if any; Django logs its
    # transaction control too: BEGIN, and its own COMMIT, which finds the
    # transaction committed already). The success goes by libpq, with the
    # COMMIT in the same query when the body had opened a transaction: the
    # server's record of the connection's last query shows both.
    sent = [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(sent) == (1 if write else 0), sent
    if TEST_DB != "pgbouncer":  # a pooled client has no backend of its own
        last = last_query(connection.connection.info.backend_pid)
        assert last.startswith("SELECT django_dispatch_atomic_success("), last
        assert last.rstrip().endswith("COMMIT") == write, last
    row = Job.objects.get(pk=claimed.id)
    assert (row.state, row.return_value, row.lease_expires_at) == (
        JobState.SUCCEEDED,
        {"total": 3},
        None,
    )
    assert row.finished_at is not None
    assert SideEffect.objects.filter(key="k").count() == (1 if write else 0)
    record = JobUsage.objects.get(job_id=claimed.id)
    assert (
        record.outcome,
        record.namespace,
        record.task_path,
        record.queue_name,
        record.worker_id,
        record.host,
        record.attempt,
        record.started_at,
        record.wall_seconds,
        record.cpu_seconds,
        record.peak_rss_mb,
        record.resources,
    ) == (
        "succeeded",
        claimed.lease.namespace,
        "tests.testapp.tasks.add",
        "atomic-q",
        WORKER,
        "host-1",
        1,
        claimed.claimed_at,
        0.25,
        None,
        61.5,
        claimed.row.get("resources"),
    )
    assert connection.get_autocommit()  # the block ended as any other


@postgres_only
@pytest.mark.parametrize("write", [True, False], ids=["body-wrote", "body-wrote-nothing"])
def test_a_lost_fence_commits_nothing_not_even_the_body(write):
    claimed = _running()
    # Taken over meanwhile: a new epoch, as the reclaim writes it.
    Job.objects.filter(pk=claimed.id).update(lease_epoch=claimed.lease.epoch + 1)
    hooks: list[str] = []
    won, rolled_back = _commit(claimed.lease, "x", _usage(claimed), write=write, hooks=hooks)
    assert (won, rolled_back, hooks) == (False, True, [])
    row = Job.objects.get(pk=claimed.id)
    assert (row.state, row.return_value, row.finished_at) == (JobState.RUNNING, None, None)
    assert not SideEffect.objects.filter(key="k").exists()
    assert not JobUsage.objects.filter(job_id=claimed.id).exists()
    # The connection is usable at once, outside any transaction.
    assert connection.get_autocommit() and not connection.in_atomic_block
    assert Job.objects.filter(pk=claimed.id).exists()


@postgres_only
def test_a_cancelled_job_is_lost_and_without_a_usage_record_nothing_is_recorded():
    claimed = _running()
    Job.objects.filter(pk=claimed.id).update(state=JobState.CANCELLED)
    won, _ = _commit(claimed.lease, None, None, write=True, hooks=[])
    assert not won
    assert Job.objects.get(pk=claimed.id).state == JobState.CANCELLED
    other = _running()
    won, _ = _commit(other.lease, None, None, write=False, hooks=[])
    assert won
    row = Job.objects.get(pk=other.id)
    assert (row.state, row.return_value) == (JobState.SUCCEEDED, None)
    assert not JobUsage.objects.filter(job_id__in=[claimed.id, other.id]).exists()


@postgres_only
def test_an_error_in_the_body_transaction_is_raised_and_commits_nothing():
    claimed = _running()
    with pytest.raises(Exception, match="current transaction is aborted"), transaction.atomic():
        SideEffect.objects.create(key="k", note="body")
        # A raw error the body swallowed.
        with connection.cursor() as cursor, contextlib.suppress(Exception):
            cursor.execute("SELECT 1 / 0")
        job_commit_success_if_leased(claimed.lease, None, None, db="default")
    assert Job.objects.get(pk=claimed.id).state == JobState.RUNNING
    assert not SideEffect.objects.filter(key="k").exists()


def test_only_unkeyed_jobs_on_postgresql_take_the_one_round_trip_path():
    unkeyed = Lease(1, WORKER, 1)
    keyed = Lease(1, WORKER, 1, partition_key="customer-1")
    assert fast_path_available("default", unkeyed) is ON_POSTGRES
    assert fast_path_available("default", keyed) is False


@postgres_only
def test_values_that_need_escaping_reach_the_row_and_the_record_intact():
    """The success's values travel as literals escaped by libpq: quotes,
    backslashes, newlines and non-ASCII text must arrive as they left."""
    worker = "w'at\\x\nü"
    tasks.add.using(queue_name="atomic-q").enqueue(1, 2)
    (claimed,) = store.jobs_claim(worker_id=worker, queues=("atomic-q",), limit=1, lease_seconds=30)
    value = {"note": "it's a \\ back'slash\n\u2028 ü 🙂", "n": [1.5, None, True]}
    usage = dataclasses.replace(
        _usage(claimed), worker_id=worker, host="h'ost\\", cpu_seconds=0.125
    )
    won, rolled_back = _commit(claimed.lease, value, usage, write=True, hooks=[])
    assert (won, rolled_back) == (True, False)
    row = Job.objects.get(pk=claimed.id)
    assert (row.state, row.return_value, row.worker_id) == (JobState.SUCCEEDED, value, worker)
    record = JobUsage.objects.get(job_id=claimed.id)
    assert (record.worker_id, record.host, record.cpu_seconds) == (worker, "h'ost\\", 0.125)
    assert SideEffect.objects.filter(key="k").count() == 1


@postgres_only
def test_finished_at_is_when_the_success_was_written_not_when_the_body_began():
    """The body's transaction began with its first write: the job's
    ``finished_at`` must be the success's time, after the rest of the body."""
    claimed = _running()
    with transaction.atomic():
        SideEffect.objects.create(key="k", note="body")  # the transaction's start
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            began = cursor.fetchone()[0]
        time.sleep(0.3)  # the rest of the body
        assert job_commit_success_if_leased(claimed.lease, None, None, db="default")
    finished = Job.objects.get(pk=claimed.id).finished_at
    assert (finished - began).total_seconds() >= 0.3


def _terminate(pid: int) -> None:
    """End backend ``pid`` from another thread's connection, as a failover would."""

    def terminate() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        finally:
            connections["default"].close()

    thread = threading.Thread(target=terminate)
    thread.start()
    thread.join()


@postgres_only
@pytest.mark.skipif(TEST_DB == "pgbouncer", reason="a pooled client has no backend of its own")
@pytest.mark.parametrize("write", [True, False], ids=["body-wrote", "body-wrote-nothing"])
def test_a_connection_cut_before_the_success_raises_and_commits_nothing(write):
    claimed = _running()
    with pytest.raises(DatabaseError) as raised, transaction.atomic():
        if write:
            SideEffect.objects.create(key="k", note="body")
        _terminate(connection.connection.info.backend_pid)
        job_commit_success_if_leased(claimed.lease, None, None, db="default")
    assert lost_connection(raised.value)  # retried as a lost connection, not the job's fault
    connection.close()
    assert Job.objects.get(pk=claimed.id).state == JobState.RUNNING
    assert not SideEffect.objects.filter(key="k").exists()
