"""``@task(atomic=True)``: the body's writes commit with the job's success, or not at all.

In-process drains run the worker's own path (``testing.drain``); where a
lease is lost or a worker frozen, a real ``rundispatch`` process runs the job
and the test acts on the database and the process from outside.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from django_dispatch import run_now, store, task
from django_dispatch.compat import InvalidTask, task_finished
from django_dispatch.models import Artifact, DeadLetter, Job, JobUsage
from django_dispatch.runtime import atomic, attempt
from django_dispatch.runtime.running import RunningJob
from django_dispatch.runtime.slots import Slots
from django_dispatch.services.jobs import cancel
from django_dispatch.states import JobState
from django_dispatch.store import atomic_finish
from django_dispatch.testing import drain
from tests.conftest import ON_POSTGRES, postgres_only, wait_until
from tests.testapp import atomic_tasks, tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def notes(key: str) -> list[str]:
    return sorted(SideEffect.objects.filter(key=key).values_list("note", flat=True))


def job(result) -> Job:
    return Job.objects.get(pk=int(result.id))


async def fetch() -> None:
    """Not a task: decorated by the test below."""


def plain() -> None:
    """Not a task: decorated by the test below."""


def test_an_async_atomic_task_is_refused_at_definition():
    with pytest.raises(InvalidTask, match=r"async def with atomic=True.*Make it a def"):
        task(atomic=True)(fetch)
    with pytest.raises(InvalidTask, match="atomic must be True or False, got 'yes'"):
        task(atomic="yes")(plain)  # type: ignore[call-overload]
    assert task(atomic=True)(plain).atomic is True


def test_an_atomic_task_that_raises_keeps_none_of_its_writes_and_ends_dead_lettered():
    result = atomic_tasks.write_then_fail.enqueue("doomed")
    drain()
    row = job(result)
    assert (row.state, row.attempts) == (JobState.FAILED, 3)
    assert DeadLetter.objects.filter(job_id=row.pk).exists()
    assert notes("doomed") == []  # three attempts wrote a row each: all rolled back
    assert [e["exception_class_path"] for e in row.errors] == ["builtins.RuntimeError"] * 3


def test_a_retry_that_succeeds_keeps_only_its_own_writes():
    result = atomic_tasks.write_then_fail.enqueue("second-time", succeed_on=2)
    drain()
    row = job(result)
    assert (row.state, row.attempts, row.return_value) == (JobState.SUCCEEDED, 2, "second-time")
    assert notes("second-time") == ["attempt-2"]


def test_a_body_that_marks_its_transaction_for_rollback_commits_nothing():
    """``transaction.set_rollback(True)`` in the body: Django's promise is that
    the block rolls back, so neither the body's rows nor a success may commit."""
    result = atomic_tasks.write_then_mark_for_rollback.enqueue("dry-run")
    drain()
    row = job(result)
    assert notes("dry-run") == []
    assert row.state == JobState.FAILED
    assert row.errors[-1]["exception_class_path"].endswith("TransactionManagementError")
    if ON_POSTGRES:  # SQLite's success goes through a cursor: Django's own refusal
        assert "marked for rollback" in row.errors[-1]["message"]


def test_a_success_commits_its_rows_its_success_and_its_usage_record_together():
    result = atomic_tasks.write_rows.enqueue("paid", rows=3)
    drain()
    row = job(result)
    assert (row.state, row.return_value, row.lease_expires_at) == (JobState.SUCCEEDED, "paid", None)
    assert notes("paid") == ["atomic"] * 3
    usage = JobUsage.objects.get(job_id=row.pk)
    assert (usage.outcome, usage.attempt) == ("succeeded", 1)
    assert usage.wall_seconds is not None


def test_keyed_atomic_jobs_commit_their_writes_and_hand_their_key_on_in_order():
    # A keyed success takes the wave's path inside the body's transaction
    # (the key's lock, the promotion of the next job), whether the body's
    # first statement carried the BEGIN (it wrote) or that path opened the
    # transaction itself (it wrote nothing).
    keyed = atomic_tasks.write_rows.using(partition_key="customer-1")
    results = [keyed.enqueue("keyed-a", rows=2), keyed.enqueue("keyed-b", rows=0)]
    results.append(keyed.enqueue("keyed-c", rows=1))
    drain()
    rows = [job(result) for result in results]
    assert [(row.state, row.return_value) for row in rows] == [
        (JobState.SUCCEEDED, "keyed-a"),
        (JobState.SUCCEEDED, "keyed-b"),
        (JobState.SUCCEEDED, "keyed-c"),
    ]
    assert rows[0].finished_at <= rows[1].finished_at <= rows[2].finished_at
    assert (notes("keyed-a"), notes("keyed-b"), notes("keyed-c")) == (
        ["atomic"] * 2,
        [],
        ["atomic"],
    )
    assert JobUsage.objects.filter(job_id__in=[row.pk for row in rows]).count() == 3


def test_jobs_enqueued_by_an_atomic_task_exist_only_if_its_writes_commit():
    sent = atomic_tasks.write_and_enqueue.enqueue("sent")
    failed = atomic_tasks.write_and_enqueue.enqueue("unsent", fail=True)
    drain()
    assert job(sent).state == JobState.SUCCEEDED
    assert job(failed).state == JobState.FAILED
    follow_ups = Job.objects.filter(task_path=tasks.noop.module_path)
    assert [(j.args, j.state) for j in follow_ups] == [(["sent"], JobState.SUCCEEDED)]
    assert notes("sent") == ["atomic"] and notes("unsent") == []


def test_save_artifact_in_an_atomic_task_is_refused_and_writes_nothing():
    result = atomic_tasks.save_an_artifact.enqueue("artifact")
    drain()
    row = job(result)
    assert row.state == JobState.FAILED
    assert "cannot be used in an atomic task" in row.errors[-1]["message"]
    assert "follow-up job" in row.errors[-1]["message"]
    assert notes("artifact") == [] and not Artifact.objects.exists()


def _started(tmp_path: Path, name: str = "started") -> tuple[str, Path]:
    return str(tmp_path / name), tmp_path / name


def _row_is_unlocked(job_id: int) -> bool:
    """From this test's own connection: lock the job's row without waiting (PostgreSQL)."""
    with transaction.atomic():
        return Job.objects.select_for_update(nowait=True).filter(pk=job_id).exists()


def test_a_lost_lease_mid_body_leaves_no_rows_and_no_success(start_worker, tmp_path):
    # On SQLite the body must not have written yet: its write lock would keep
    # this test's takeover waiting until the body ends.
    signal_file, started = _started(tmp_path)
    release = tmp_path / "release"
    result = atomic_tasks.write_and_wait.enqueue(
        "lost", signal_file, str(release), write_first=ON_POSTGRES
    )
    worker = start_worker("--concurrency", "1")
    wait_until(started.exists, what="the atomic body to start")
    # Another worker's takeover, as the reclaim does it: a new epoch. The job
    # then waits for a retry far away, so nothing runs it again here.
    Job.objects.filter(pk=int(result.id)).update(
        lease_epoch=F("lease_epoch") + 1,
        state=JobState.PENDING,
        worker_id=None,
        run_after=timezone.now() + timedelta(hours=1),
    )
    release.touch()
    worker.signal(signal.SIGTERM)  # a clean stop waits for the body to end
    assert worker.wait() == 0, worker.output()
    assert notes("lost") == []
    lost_lines = [line for line in worker.output().splitlines() if "lost" in line]
    assert any(f"job {result.id} " in line for line in lost_lines), worker.output()
    row = job(result)
    assert (row.state, row.return_value, row.finished_at) == (JobState.PENDING, None, None)
    assert not JobUsage.objects.filter(job_id=row.pk, outcome="succeeded").exists()


@postgres_only  # row locks
def test_a_frozen_atomic_body_holds_no_lock_on_the_job_and_is_reclaimed(start_worker, tmp_path):
    signal_file, started = _started(tmp_path)
    release = tmp_path / "release"
    result = atomic_tasks.write_and_wait.enqueue("frozen", signal_file, str(release))
    worker = start_worker("--concurrency", "1")
    wait_until(started.exists, what="the atomic body to write and wait")
    job_id = int(result.id)
    assert _row_is_unlocked(job_id)  # the body wrote, and still the job's row is free
    worker.signal(signal.SIGSTOP)  # frozen mid-body, its transaction open
    try:
        Job.objects.filter(pk=job_id).update(lease_expires_at=timezone.now() - timedelta(1))
        requeued, failed = store.jobs_rescue_expired(max_worker_lost=3)
        assert (requeued, failed) == ([job_id], [])  # the reclaim did not skip it
    finally:
        worker.signal(signal.SIGCONT)
    started.unlink()
    release.touch()
    # The woken body's success is fenced out and rolls back; the retry (this
    # same worker) runs the body once more, and that run commits.
    wait_until(lambda: job(result).state == JobState.SUCCEEDED, what="the retry to succeed")
    assert notes("frozen") == ["after", "before"]  # one execution's rows, not two
    assert job(result).attempts == 2
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()


def test_progress_in_an_atomic_task_saves_nothing_and_raises_once_cancelled(start_worker, tmp_path):
    signal_file, progressed = _started(tmp_path, "progressed")
    result = atomic_tasks.progress_until_cancelled.enqueue(
        "progress", signal_file, write_first=ON_POSTGRES
    )
    job_id = int(result.id)
    Job.objects.filter(pk=job_id).update(checkpoint={"from": "an earlier version"})
    worker = start_worker("--concurrency", "1")
    wait_until(progressed.exists, what="progress() to be called")
    assert job(result).checkpoint == {"from": "an earlier version"}  # nothing saved
    assert progressed.with_suffix(".checkpoint").read_text() == "None"  # nor resumed from
    if ON_POSTGRES:
        assert _row_is_unlocked(job_id)
    assert cancel(result.id)
    wait_until(progressed.with_suffix(".cancelled").exists, what="progress() to raise")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    row = job(result)
    assert (row.state, row.checkpoint) == (JobState.CANCELLED, {"from": "an earlier version"})
    assert notes("progress") == []


def test_run_now_runs_an_atomic_task_on_the_same_path():
    failing = atomic_tasks.write_then_fail.enqueue("now-failing")
    assert run_now(failing.id) is True
    assert job(failing).state == JobState.SCHEDULED  # waiting for its retry, nothing kept
    assert notes("now-failing") == []
    paid = atomic_tasks.write_rows.enqueue("now-paid", rows=1)
    assert run_now(paid.id) is True
    assert (job(paid).state, notes("now-paid")) == (JobState.SUCCEEDED, ["atomic"])


def test_an_atomic_task_over_its_timeout_keeps_none_of_its_writes(start_worker):
    result = atomic_tasks.write_past_timeout.enqueue("late", write_first=ON_POSTGRES)
    worker = start_worker("--burst", "--concurrency", "1")
    assert worker.wait() == 0, worker.output()
    row = job(result)
    assert row.state == JobState.FAILED, worker.output()
    assert row.errors[-1]["exception_class_path"] == "django_dispatch.exceptions.TaskTimeout"
    assert notes("late") == []  # it returned normally once asked to stop: still rolled back


def test_an_atomic_success_is_not_taken_for_lost_while_its_report_runs(caplog):
    """The job's row is succeeded while task_finished receivers (user code, on the job
    thread) still run: the heartbeat must not report it 'cancelled or lost'."""

    def slow_receiver(sender, task_result, **kwargs):
        time.sleep(1.0)  # over three heartbeats of the test settings (0.3 s)

    task_finished.connect(slow_receiver)
    try:
        with caplog.at_level("INFO", logger="django_dispatch"):
            enqueued = atomic_tasks.write_rows.enqueue("reported")
            assert drain() == 1
    finally:
        task_finished.disconnect(slow_receiver)
    assert Job.objects.get(pk=enqueued.id).state == JobState.SUCCEEDED
    stops = [r.getMessage() for r in caplog.records if "asking it to stop" in r.getMessage()]
    assert stops == []


def test_an_atomic_success_waiting_for_its_commit_is_not_taken_for_a_long_running_job(
    monkeypatch,
):
    """While an atomic job's success is being committed (a WAL flush, which a busy
    disk stretches), its slot counts free for the next claim, and the wait is not
    taken for a long job: the job claimed ahead stays, and claiming ahead goes on."""
    atomic_tasks.write_rows.enqueue("committing", rows=1)
    tasks.noop.enqueue()
    first, ahead = store.jobs_claim(worker_id="w-slots", queues=(), limit=2, lease_seconds=30)
    slots = Slots(concurrency=1, prefetch=1)
    slots.ran(0.001)  # only short jobs so far: one is claimed ahead of the thread
    committing = RunningJob(claimed=first, lease_seconds=30, begun_at=time.monotonic() - 1.0)
    waiting = RunningJob(claimed=ahead, lease_seconds=30)  # no thread yet
    slots.running = {first.id: committing, ahead.id: waiting}
    attempt.resolve(committing)
    seen: list[tuple[int, list[RunningJob]]] = []

    def observe(execute, sql, params, many, context):
        if "dispatch_job" in sql:  # the success's write, through Django's cursor
            seen.append((slots.free(), slots.behind_long_jobs()))
        return execute(sql, params, many, context)

    # On PostgreSQL the success goes by libpq, past Django's cursor: watch the call.
    sent_by_libpq = atomic_finish.job_commit_success_if_leased

    def observed(*args, **kwargs):
        seen.append((slots.free(), slots.behind_long_jobs()))
        return sent_by_libpq(*args, **kwargs)

    monkeypatch.setattr(atomic_finish, "job_commit_success_if_leased", observed)
    with connection.execute_wrapper(observe):
        outcome = atomic.execute(first, committing, "default")
    assert (outcome.kind, committing.won) == ("succeeded", True)
    assert seen and all(entry == (1, []) for entry in seen), seen
    assert not waiting.abandoned and slots.ahead() == 1
    assert notes("committing") == ["atomic"]
