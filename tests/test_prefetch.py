"""Jobs claimed ahead of free threads, and successes that do not hold their thread (#20).

A job thread hands a success to the next completion wave and takes its next
job at once; while jobs are short, the worker holds a few jobs claimed ahead
of its threads so that there is a next job to take. Neither may lose a job,
run one twice, or keep a job leased and unstarted through a shutdown.
"""

import signal

import pytest

from django_dispatch.compat import TaskResultStatus, task_finished
from django_dispatch.models import Job, JobUsage
from django_dispatch.runtime.executor import Outcome, RunningJob
from django_dispatch.runtime.jobthreads import PREFETCH_JOB_SECONDS, Slots
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from tests.conftest import wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution


def fake_running(job_id: int) -> RunningJob:
    """A RunningJob for Slots' arithmetic only (Slots reads ``finished`` and ``on_loop``)."""
    return RunningJob(claimed=None, lease_seconds=1.0)  # type: ignore[arg-type]


def test_jobs_are_claimed_ahead_only_while_they_are_short():
    slots = Slots(4, prefetch=4)
    assert slots.free() == 4  # no job has run here yet: none ahead
    slots.ran(0.001)
    assert slots.free() == 8
    for _ in range(30):
        slots.ran(PREFETCH_JOB_SECONDS * 4)  # jobs got long
    assert slots.free() == 4
    slots.job_seconds = 0.001
    slots.stopping = True
    assert slots.free() == 4  # a stopping worker claims nothing ahead


def test_a_success_waiting_for_its_wave_holds_no_slot():
    slots = Slots(2)
    slots.running = {1: fake_running(1), 2: fake_running(2)}
    assert slots.free() == 0
    slots.running[1].finished = Outcome(kind="succeeded")
    assert slots.free() == 1


@pytest.mark.django_db(transaction=True)
def test_every_short_job_runs_once_with_its_usage_record_and_signal():
    """400 short jobs through 2 threads: each ran once, each success has its
    usage record (written by the wave, from the meter its thread left behind)
    and its task_finished, sent after the write."""
    finished: list[str] = []

    def on_finished(sender, task_result, **kwargs):
        finished.append(task_result.id)

    task_finished.connect(on_finished)
    try:
        enqueued = [tasks.record.enqueue(f"short-{i}") for i in range(400)]
        assert drain(concurrency=2) == 400
    finally:
        task_finished.disconnect(on_finished)
    assert Execution.objects.filter(key__startswith="short-").count() == 400
    ids = [int(e.id) for e in enqueued]
    assert Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED, attempts=1).count() == 400
    usage = JobUsage.objects.filter(job_id__in=ids)
    assert usage.count() == 400
    assert not usage.filter(wall_seconds__isnull=True).exists()
    assert sorted(finished) == sorted(e.id for e in enqueued)
    assert {tasks.record.get_result(e.id).status for e in enqueued} == {TaskResultStatus.SUCCESSFUL}


@pytest.mark.django_db(transaction=True)
def test_sigterm_hands_back_jobs_claimed_ahead_without_spending_attempts(start_worker):
    """SIGTERM in the middle of a drain of short jobs: every job either ran
    exactly once and succeeded, or is pending again with no attempt spent;
    none is left running (leased to the stopped worker) or failed."""
    enqueued = [tasks.record.enqueue(f"stop-{i}") for i in range(3000)]
    ids = [int(e.id) for e in enqueued]
    worker = start_worker("--concurrency", "2", "--processes", "2")
    wait_until(
        lambda: Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() > 300,
        what="the drain to be under way",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    succeeded = Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED)
    pending = Job.objects.filter(pk__in=ids, state=JobState.PENDING)
    assert succeeded.count() + pending.count() == 3000
    assert pending.count() > 0  # it was stopped mid-drain
    assert not pending.exclude(attempts=0).exists()
    assert Execution.objects.filter(key__startswith="stop-").count() == succeeded.count()
