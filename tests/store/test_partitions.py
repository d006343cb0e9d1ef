"""Partitioned FIFO, cancellation of partitioned jobs, and idempotency keys."""

from __future__ import annotations

import itertools
import random
import signal
import threading
import time
from collections import defaultdict
from contextlib import contextmanager

import pytest
from django.db import IntegrityError, connection, transaction

from django_dispatch import cancel, enqueue_many, store
from django_dispatch.compat import TaskResultStatus
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.testing import drain
from tests.concurrency import run_concurrently
from tests.conftest import postgres_only, wait_until
from tests.testapp import tasks
from tests.testapp.models import SideEffect, Step

pytestmark = pytest.mark.django_db(transaction=True)


def claim(worker="w", limit=10):
    return store.jobs_claim(worker_id=worker, queues=(), limit=limit, lease_seconds=30)


def keyed(key, n, task=tasks.add):
    args = (lambda i: (i, i)) if task is tasks.add else (lambda i: (f"m{i}",))
    return [task.using(partition_key=key).enqueue(*args(i)) for i in range(n)]


def state(result):
    return Job.objects.get(pk=result.id).state


# --- the claim's partition rules ------------------------------------------------


def test_only_the_head_of_a_partition_is_claimed_and_in_order():
    a = keyed("A", 3)
    b = keyed("B", 2)
    free = tasks.add.enqueue(9, 9)
    first = {c.id for c in claim()}
    assert first == {int(a[0].id), int(b[0].id), int(free.id)}
    assert claim() == []  # everything else waits behind a running head
    assert {state(r) for r in a[1:] + b[1:]} == {JobState.BLOCKED}  # out of the claim index

    for job in Job.objects.filter(state=JobState.RUNNING):
        lease = store.Lease(job.pk, job.worker_id, job.lease_epoch)
        assert store.job_finish_if_leased(lease, 0, partition_key=job.partition_key)
    assert {c.id for c in claim()} == {int(a[1].id), int(b[1].id)}


def test_the_database_forbids_two_running_jobs_of_one_key():
    a = keyed("A", 2)
    claim(limit=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=a[1].id).update(state=JobState.RUNNING)


def test_priority_orders_partitions_never_inside_one():
    low_first = tasks.add.using(partition_key="K", priority=-10).enqueue(1, 1)
    high_second = tasks.add.using(partition_key="K", priority=90).enqueue(2, 2)
    (claimed,) = claim()
    assert claimed.id == int(low_first.id)
    assert state(high_second) == JobState.BLOCKED


def test_failed_or_cancelled_head_does_not_block_the_next():
    a = keyed("A", 3, task=tasks.fail_always)
    (head,) = claim()
    assert store.job_fail_if_leased(head.lease, [], None, partition_key="A")  # for good
    (second,) = claim()
    assert second.id == int(a[1].id)
    assert cancel(a[1].id)  # running: keeps the key until its worker lets go
    assert claim() == []
    assert store.job_ack_cancelled(second.lease, partition_key="A")
    assert [c.id for c in claim()] == [int(a[2].id)]


def test_a_head_waiting_for_its_retry_blocks_the_key():
    a = keyed("A", 2)
    (head,) = claim()
    assert store.job_fail_if_leased(head.lease, [], retry_in=3600, partition_key="A")
    assert claim() == []  # the head is not due, and the next may not overtake it
    assert store.jobs_retry_now() == 1
    assert [c.id for c in claim()] == [int(a[0].id)]


def test_cancelling_a_pending_head_promotes_the_next():
    a = keyed("A", 3)
    claim()  # a[0] runs, a[1] and a[2] are demoted
    assert cancel(a[1].id)
    assert claim() == []
    job = Job.objects.get(pk=a[0].id)
    store.job_finish_if_leased(
        store.Lease(job.pk, job.worker_id, job.lease_epoch), 1, partition_key="A"
    )
    assert [c.id for c in claim()] == [int(a[2].id)]


def test_the_demotion_checks_again_under_the_key_lock():
    """The claim's first look at the heads takes no lock; the demotion itself
    checks again, so a job found runnable by then is not demoted."""
    from django_dispatch.store.partitions import partitions_demote

    def demote(key, *jobs):
        with transaction.atomic():
            return partitions_demote("default", [(int(j.id), key) for j in jobs])

    a = keyed("A", 2)
    assert demote("A", *a) == {int(a[1].id)}  # the head, with nothing running, stays
    assert (state(a[0]), state(a[1])) == (JobState.PENDING, JobState.BLOCKED)

    held, freed = keyed("H", 2), keyed("F", 2)
    # A cancelled job still held by its worker keeps its key busy; once let go, not.
    Job.objects.filter(pk=held[0].id).update(
        state=JobState.CANCELLED, lease_expires_at="2999-01-01T00:00:00Z"
    )
    Job.objects.filter(pk=freed[0].id).update(state=JobState.CANCELLED)
    assert demote("H", held[1]) == {int(held[1].id)}
    assert demote("F", freed[1]) == set()


@contextmanager
def key_locked_elsewhere(key):
    """Another connection holds ``key``'s partition lock until the block ends."""
    from django_dispatch.store.partitions import lock_partitions

    locked, release = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                lock_partitions("default", [key])
                locked.set()
                release.wait(20)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(20)
        yield
    finally:
        release.set()
        holder.join(20)


@postgres_only
def test_a_claim_never_waits_for_a_busy_key_and_leaves_its_jobs_pending():
    a = keyed("A", 3)
    free = tasks.add.enqueue(1, 1)
    (head,) = claim(limit=1)
    assert head.id == int(a[0].id)
    with key_locked_elsewhere("A"):
        started = time.monotonic()
        assert [c.id for c in claim()] == [int(free.id)]  # not the busy key's jobs...
        assert time.monotonic() - started < 1
        assert state(a[1]) == state(a[2]) == JobState.PENDING  # ...nor demoted
    assert claim() == []
    assert state(a[1]) == state(a[2]) == JobState.BLOCKED  # demoted once the key was free


@postgres_only
@pytest.mark.parametrize("how", ["finish", "fail", "cancel_next", "release"])
def test_transitions_that_can_free_a_key_wait_for_its_lock(how):
    a = keyed("A", 3)
    (head,) = claim(limit=1)
    unkeyed = tasks.add.enqueue(1, 1)
    (other,) = claim(limit=1)
    assert other.id == int(unkeyed.id)
    transitions = {
        "finish": lambda: store.job_finish_if_leased(head.lease, 1, partition_key="A"),
        "fail": lambda: store.job_fail_if_leased(head.lease, [], None, partition_key="A"),
        "cancel_next": lambda: cancel(a[1].id),
        "release": lambda: store.job_release_if_leased(head.lease, attempts=0, worker_ids=[]),
    }
    done = threading.Event()

    def run():
        try:
            assert transitions[how]()
            done.set()
        finally:
            connection.close()

    with key_locked_elsewhere("A"):
        # An unkeyed job's transition takes no partition lock: it goes through.
        assert store.job_finish_if_leased(other.lease, 1)
        worker = threading.Thread(target=run)
        worker.start()
        assert not done.wait(0.3)  # waits for the key's lock
    worker.join(20)
    assert done.is_set()


def test_a_batch_with_a_lease_that_lost_its_key_still_promotes(caplog):
    """A lease built by hand without its job's key: the batch learns the key
    from its UPDATE and takes the key's lock then (without waiting)."""
    a = keyed("A", 2)
    (head,) = claim()
    bare = store.Lease(head.lease.job_id, head.lease.worker_id, head.lease.epoch)
    assert bare == head.lease and bare.partition_key is None
    with transaction.atomic():
        assert store.jobs_finish_many_if_leased([(bare, 1)]) == {head.id}
    assert state(a[1]) == JobState.PENDING
    assert "did not carry their partition key" in caplog.text


def test_a_cancelled_job_still_held_is_not_deleted():
    from django_dispatch.services import delete_finished_jobs

    a = keyed("A", 2)
    claim()
    assert cancel(a[0].id)
    assert delete_finished_jobs([int(a[0].id)]) == 0  # its worker has not let go
    job = Job.objects.get(pk=a[0].id)
    store.job_ack_cancelled(store.Lease(job.pk, job.worker_id, job.lease_epoch), partition_key="A")
    assert delete_finished_jobs([int(a[0].id)]) == 1


def test_expired_cancelled_job_frees_its_partition():
    a = keyed("A", 2)
    claim()
    assert cancel(a[0].id)
    assert claim() == []
    Job.objects.filter(pk=a[0].id).update(lease_expires_at="2000-01-01T00:00:00Z")
    store.jobs_rescue_expired(max_worker_lost=3)
    assert [c.id for c in claim()] == [int(a[1].id)]


def test_an_older_job_committed_late_waits_for_the_running_one():
    """ids are handed out before commit: the older id may appear after a newer one ran."""
    newer = tasks.add.using(partition_key="A").enqueue(2, 2)
    claim()
    older = Job.objects.create(task_path="tests.testapp.tasks.add", args=[1, 1], partition_key="A")
    Job.objects.filter(pk=older.pk).update(id=int(newer.id) - 1000)  # an older id
    assert claim() == []
    job = Job.objects.get(pk=newer.id)
    store.job_finish_if_leased(
        store.Lease(job.pk, job.worker_id, job.lease_epoch), 1, partition_key="A"
    )
    assert [c.id for c in claim()] == [int(newer.id) - 1000]


def test_deep_backlogs_leave_the_claim_index():
    for key in range(20):
        enqueue_many(tasks.add.using(partition_key=f"k{key}"), [((i, i), {}) for i in range(30)])
    enqueue_many(tasks.add, [((i, i), {}) for i in range(5)])
    # 580 blocked jobs come first in claim order; each claim demotes the ones it
    # meets, so a few claims find all 20 heads and the 5 unkeyed jobs...
    claimed, calls = [], 0
    while batch := store.jobs_claim(worker_id="w", queues=(), limit=25, lease_seconds=30):
        claimed += batch
        calls += 1
    assert len(claimed) == len({c.id for c in claimed}) == 25 and calls <= 8
    # ...and no blocked job is left in the claim index to be scanned again.
    assert Job.objects.filter(state=JobState.PENDING).count() == 0
    assert Job.objects.filter(state=JobState.BLOCKED).count() == 580


# --- real workers ---------------------------------------------------------------


@pytest.mark.slow
def test_fifo_per_key_across_processes_with_unkeyed_flowing(start_worker):
    # Fewer keys than the 8 slots of the two workers: at most 6 heads are
    # runnable at once, so unkeyed jobs must flow beside them throughout. (With
    # more keys than slots, FIFO by enqueue time rightly runs the older keyed
    # jobs first, and whether any unkeyed one finished before the last keyed
    # one was down to timing.)
    keys, per_key = 6, 40
    calls = [(f"key-{k}", seq) for seq in range(per_key) for k in range(keys)]
    random.Random(7).shuffle(calls)  # interleave keys; per key, enqueue order = seq order
    by_key: dict[str, int] = defaultdict(int)
    ordered = []
    for key, _ in calls:
        ordered.append((key, by_key[key]))
        by_key[key] += 1
    for key, seq in ordered:
        tasks.ordered_step.using(partition_key=key).enqueue(key, seq)
    enqueue_many(tasks.ordered_step, [(("free", i), {}) for i in range(300)])
    workers = [start_worker("--burst", "--concurrency", "4") for _ in range(2)]
    for worker in workers:
        assert worker.wait(240) == 0, worker.output()

    assert Job.objects.exclude(state=JobState.SUCCEEDED).count() == 0
    runs: dict[str, list[Step]] = defaultdict(list)
    for step in Step.objects.exclude(key="free").order_by("started"):
        runs[step.key].append(step)
    assert len(runs) == keys
    for key, steps in runs.items():
        assert [s.seq for s in steps] == list(range(per_key)), f"{key} ran out of order"
        for before, after in itertools.pairwise(steps):
            assert after.started >= before.finished, f"{key}: {before.seq} overlapped {after.seq}"
    assert Step.objects.values("worker_pid").distinct().count() == 2
    # Unkeyed jobs were not starved behind the partitions.
    last_keyed_end = max(s.finished for steps in runs.values() for s in steps)
    free_done_before = Step.objects.filter(key="free", finished__lt=last_keyed_end).count()
    assert free_done_before > 0


@pytest.mark.slow
def test_sigkill_after_item_60_resumes_at_61_on_another_worker(start_worker, tmp_path):
    hold = tmp_path / "hold"
    enqueued = tasks.count_and_hold.enqueue("resume", 100, 60, str(hold))
    victim = start_worker("--concurrency", "1")
    wait_until(lambda: Job.objects.get(pk=enqueued.id).checkpoint == 60, what="item 60")
    victim.signal(signal.SIGKILL)
    victim.wait()
    survivor = start_worker("--concurrency", "1")
    wait_until(lambda: tasks.count_and_hold.get_result(enqueued.id).is_finished, timeout=30)
    survivor.signal(signal.SIGTERM)
    survivor.wait()
    result = tasks.count_and_hold.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 2
    items = list(
        SideEffect.objects.filter(key="resume").order_by("id").values_list("note", "worker_pid")
    )
    assert [int(n) for n, _ in items] == list(range(1, 101))  # each item exactly once
    first_pid = items[0][1]
    assert {pid for n, pid in items if int(n) <= 60} == {first_pid}
    assert {pid for n, pid in items if int(n) >= 61} == {survivor.pid}


# --- cancellation through a worker ---------------------------------------------


def test_cancelling_a_running_partitioned_job_lets_the_next_run_after_it_stops():
    first = tasks.count_to.using(partition_key="C").enqueue("c1", 10_000, 0.005)
    second = tasks.record_many.using(partition_key="C").enqueue("c2")

    def cancel_soon():
        try:
            wait_until(lambda: SideEffect.objects.filter(key="c1").count() >= 3)
            assert cancel(first.id)
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_soon)
    canceller.start()
    drain(concurrency=2)
    canceller.join()
    assert tasks.count_to.get_result(first.id).status == TaskResultStatus.FAILED
    assert tasks.record_many.get_result(second.id).status == TaskResultStatus.SUCCESSFUL
    last_c1 = SideEffect.objects.filter(key="c1").order_by("-id").first()
    c2 = SideEffect.objects.get(key="c2")
    assert c2.id > last_c1.id  # the next job started only after the cancelled one stopped
    job = Job.objects.get(pk=first.id)
    assert job.state == JobState.CANCELLED and job.lease_expires_at is None


@pytest.mark.slow
def test_a_cancelled_job_that_ignores_the_cancel_keeps_its_partition(start_worker, tmp_path):
    release = tmp_path / "release"
    stubborn = tasks.wait_for_file.using(partition_key="S").enqueue("stubborn", str(release))
    nxt = tasks.record_many.using(partition_key="S").enqueue("next")
    worker = start_worker("--concurrency", "2")
    wait_until(lambda: SideEffect.objects.filter(key="stubborn", note="start").exists())
    assert cancel(stubborn.id)
    time.sleep(3)  # longer than the 2 s lease: the worker's heartbeat keeps it held
    assert not SideEffect.objects.filter(key="next").exists()
    release.touch()
    wait_until(lambda: tasks.record_many.get_result(nxt.id).is_finished)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    end = SideEffect.objects.get(key="stubborn", note="end")
    assert SideEffect.objects.get(key="next").id > end.id


# --- idempotency keys -------------------------------------------------------------


def test_idempotency_key_returns_the_live_job_and_frees_when_finished():
    one = tasks.add.using(idempotency_key="welcome-42").enqueue(1, 2)
    two = tasks.add.using(idempotency_key="welcome-42").enqueue(5, 5)
    assert one.id == two.id and two.args == [1, 2]
    other_task = tasks.echo.using(idempotency_key="welcome-42").enqueue("x")
    assert other_task.id != one.id  # keys are per task
    drain()
    three = tasks.add.using(idempotency_key="welcome-42").enqueue(7, 7)
    assert three.id != one.id


def test_idempotency_conflict_does_not_abort_the_callers_transaction():
    with transaction.atomic():
        one = tasks.add.using(idempotency_key="k").enqueue(1, 2)
        two = tasks.add.using(idempotency_key="k").enqueue(1, 2)
        SideEffect.objects.create(key="after-conflict")  # the transaction still works
    assert one.id == two.id and SideEffect.objects.filter(key="after-conflict").exists()


def test_concurrent_enqueues_with_one_key_create_one_job():
    def enqueue() -> str:
        with transaction.atomic():
            result = tasks.add.using(idempotency_key="race").enqueue(1, 1)
            time.sleep(0.05)  # hold the transaction open while the others try
        return result.id

    results = run_concurrently(*[enqueue] * 6, together=True)
    assert len(results) == 6 and len(set(results)) == 1
    assert Job.objects.filter(idempotency_key="race").count() == 1


def test_enqueue_many_refuses_an_idempotency_key():
    from django_dispatch.compat import InvalidTask

    with pytest.raises(InvalidTask, match="idempotency_key"):
        enqueue_many(tasks.add.using(idempotency_key="k"), [((1, 2), {})])


def test_the_leader_sweep_promotes_a_key_left_blocked_by_a_race():
    """A head finishing while the job behind it is cancelled can leave the next
    job blocked with nothing ahead of it (each promote ran on a snapshot that
    missed the other's change). The sweep finds such keys; keys with a live
    head ahead of their blocked jobs are left alone."""
    stalled = keyed("S", 3)
    healthy = keyed("H", 2)
    s_head, _ = claim(limit=2)
    assert state(stalled[1]) == state(healthy[1]) == JobState.BLOCKED
    Job.objects.filter(pk=stalled[2].id).update(state=JobState.BLOCKED)
    # The race's end state, written directly: head done, next cancelled, last blocked.
    Job.objects.filter(pk=s_head.id).update(state=JobState.SUCCEEDED, lease_expires_at=None)
    Job.objects.filter(pk=stalled[1].id).update(state=JobState.CANCELLED)
    assert claim() == []  # stalled: nothing would ever promote it

    assert store.partitions_promote_stalled("default") == 1
    assert state(stalled[2]) == JobState.PENDING
    assert state(healthy[1]) == JobState.BLOCKED  # its head still runs
    assert [c.id for c in claim()] == [int(stalled[2].id)]
    assert store.partitions_promote_stalled("default") == 0
