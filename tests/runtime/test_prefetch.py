"""Jobs claimed ahead of free threads, and successes that do not hold their thread (#20).

A job thread hands a success to the next completion wave and takes its next
job at once; while jobs are short, the worker holds a few jobs claimed ahead
of its threads so that there is a next job to take. Neither may lose a job,
run one twice, or keep a job leased and unstarted through a shutdown.
"""

import signal
import threading
import time
from types import SimpleNamespace

import pytest

from django_dispatch import enqueue_many
from django_dispatch.compat import TaskResultStatus, task_finished
from django_dispatch.models import Job, JobUsage
from django_dispatch.runtime import reporter
from django_dispatch.runtime.executor import Outcome
from django_dispatch.runtime.options import WorkerOptions
from django_dispatch.runtime.running import RunningJob
from django_dispatch.runtime.slots import PREFETCH_FACTOR, PREFETCH_JOB_SECONDS, Slots
from django_dispatch.runtime.worker import Worker
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from tests.conftest import ON_POSTGRES, postgres_only, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution, SideEffect


def fake_running(job_id: int) -> RunningJob:
    """A RunningJob for Slots' arithmetic only (Slots reads its id, ``finished``,
    ``begun_at`` and ``on_loop``)."""
    return RunningJob(claimed=SimpleNamespace(id=job_id), lease_seconds=1.0)  # type: ignore[arg-type]


def test_jobs_are_claimed_ahead_only_while_they_are_short():
    slots = Slots(4, prefetch=4)
    assert slots.free() == 4  # no job has run here yet: none ahead
    slots.ran(0.001)
    assert slots.free() == 8
    for _ in range(30):
        slots.ran(0.001)
    slots.ran(PREFETCH_JOB_SECONDS * 4)  # one long job among short ones stops it at once
    assert slots.free() == 4
    for _ in range(100):
        slots.ran(0.001)
    assert slots.free() == 4  # an average would be short again; the slowest still is not
    for _ in range(300):
        slots.ran(0.001)
    assert slots.free() == 8  # forgotten after a few hundred short jobs
    slots.stopping = True
    assert slots.free() == 4  # a stopping worker claims nothing ahead


@pytest.mark.django_db
def test_a_worker_claims_twice_its_threads_ahead_on_postgresql_only():
    """Twice: each wave carries what the worker holds, and most of a wave's
    server cost is the same whatever its size. None on SQLite, whose one
    writer makes a claim round trip save little."""
    worker = Worker(
        WorkerOptions(worker_id="prefetch-factor", concurrency=3, burst=True, scheduler=False),
        close_connections=False,
    )
    assert worker.slots.prefetch == (2 * 3 if ON_POSTGRES else 0)


def test_jobs_held_ahead_go_back_once_a_running_job_is_long():
    slots = Slots(2, prefetch=2)
    slots.ran(0.001)
    slots.running = {n: fake_running(n) for n in range(1, 5)}  # 2 running, 2 ahead
    for n in (1, 2):
        slots.running[n].begun_at = time.monotonic()
    assert slots.behind_long_jobs() == [] and slots.holding_ahead  # behind short jobs
    slots.running[2].begun_at = time.monotonic() - PREFETCH_JOB_SECONDS * 2
    # Thread 1, still on a short job, keeps its share (its job and one ahead):
    # the newest job held goes back.
    given = slots.behind_long_jobs()
    assert [j.claimed.id for j in given] == [4] and given[0].abandoned
    assert set(slots.running) == {1, 2, 3} and slots.ahead() == 0 and slots.holding_ahead
    slots.running[1].begun_at = time.monotonic() - PREFETCH_JOB_SECONDS * 2
    given = slots.behind_long_jobs()  # both threads held by long jobs: the rest goes
    assert [j.claimed.id for j in given] == [3] and given[0].abandoned
    assert set(slots.running) == {1, 2} and not slots.holding_ahead
    slots.running[1].finished = Outcome(kind="succeeded")  # a thread is free again:
    slots.running[3] = fake_running(3)  # its next job is not held ahead
    assert slots.behind_long_jobs() == []


def eight_threads_one_long(ahead: int) -> Slots:
    """A worker of 8 threads (16 ahead at most) running jobs 1-8, job 8 past the
    short mark, and ``ahead`` more held unstarted (ids 9 on)."""
    slots = Slots(8, prefetch=16)
    slots.ran(0.001)
    slots.running = {n: fake_running(n) for n in range(1, 9 + ahead)}
    for n in range(1, 9):
        slots.running[n].begun_at = time.monotonic()
    slots.running[8].begun_at = time.monotonic() - PREFETCH_JOB_SECONDS * 2
    return slots


def test_one_long_job_among_many_threads_sends_back_only_its_share():
    """A short job that passes the mark for a moment on a busy machine must not
    send back every job held ahead: the seven threads still on short jobs keep
    theirs (one each, and two each ahead), the long one's two ahead go back."""
    slots = eight_threads_one_long(ahead=16)
    given = slots.behind_long_jobs()
    assert [j.claimed.id for j in given] == [23, 24]
    assert len(slots.running) == 22 and slots.holding_ahead


def test_a_long_job_within_the_share_sends_nothing_back_but_stops_claiming_ahead():
    """Seven threads on short jobs hold 14 ahead (their share, and no more):
    nothing goes back, the worker still holds jobs ahead (so it looks again
    soon), and claims nothing more ahead while a job is long."""
    slots = eight_threads_one_long(ahead=14)
    assert slots.behind_long_jobs() == []
    assert len(slots.running) == 22 and slots.holding_ahead and slots.ahead() == 0


def test_a_single_thread_on_a_long_job_sends_back_all_it_holds():
    slots = Slots(1, prefetch=2)
    slots.ran(0.001)
    slots.running = {n: fake_running(n) for n in range(1, 4)}  # 1 running, 2 ahead
    slots.running[1].begun_at = time.monotonic() - PREFETCH_JOB_SECONDS * 2
    given = slots.behind_long_jobs()
    assert [j.claimed.id for j in given] == [2, 3]
    assert set(slots.running) == {1} and not slots.holding_ahead


def test_a_success_its_wave_is_writing_holds_no_slot():
    slots = Slots(2)
    slots.running = {1: fake_running(1), 2: fake_running(2)}
    assert slots.free() == 0
    queued(slots.running[1])
    assert slots.free() == 0  # until a wave takes it
    slots.running[1].in_wave = True
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
        assert drain(concurrency=2) == 400  # a job given back and claimed again counts once
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
def test_slow_finished_receivers_slow_the_jobs_instead_of_growing_a_backlog(monkeypatch):
    """task_finished receivers slower than the jobs: once REPORT_BACKLOG
    successes wait for the reporter thread, job threads write and report their
    own, so the reporter's queue stays bounded. Every job still runs once and
    is reported once, with its usage record."""
    monkeypatch.setattr(reporter, "REPORT_BACKLOG", 4)
    queued: list[int] = []
    put = reporter.Reporter.put

    def counting_put(self, running):
        queued.append(self.inbox.qsize())
        put(self, running)

    monkeypatch.setattr(reporter.Reporter, "put", counting_put)
    reported_on: list[str] = []
    reported: list[str] = []

    def slow(sender, task_result, **kwargs):
        reported.append(task_result.id)
        reported_on.append(threading.current_thread().name)
        time.sleep(0.02)

    task_finished.connect(slow)
    try:
        enqueued = [tasks.record.enqueue(f"slow-report-{i}") for i in range(150)]
        assert drain(concurrency=2) == 150
    finally:
        task_finished.disconnect(slow)
    ids = [int(e.id) for e in enqueued]
    assert Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED, attempts=1).count() == 150
    assert JobUsage.objects.filter(job_id__in=ids).count() == 150
    assert sorted(reported) == sorted(e.id for e in enqueued)
    # Both kinds of reporting happened, and the reporter's queue never held
    # more than the bound plus one wave (at most 2 threads and the jobs
    # claimed ahead of them).
    assert "dispatch-finished" in reported_on and "dispatch-job" in reported_on
    assert max(queued) <= 4 + 2 * (1 + PREFETCH_FACTOR)


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


@postgres_only  # SQLite workers claim nothing ahead
@pytest.mark.django_db(transaction=True)
def test_jobs_claimed_ahead_of_a_long_job_go_back_to_an_idle_worker(start_worker):
    """A worker that has run only short jobs claims four 4 s jobs at once (two
    threads, two ahead). Once its running jobs pass the short mark, the two it
    holds unstarted go back to the queue, without spending an attempt, and a
    worker started afterwards runs them: the four overlap in pairs rather than
    run two after two on the first worker."""
    first = start_worker("--concurrency", "2")
    # Enough no-ops to forget a start-up stall (see Slots.ran).
    warm = enqueue_many(tasks.noop, [((), {}) for _ in range(600)], return_results=True)
    warm_ids = [int(w.id) for w in warm]
    wait_until(
        lambda: Job.objects.filter(pk__in=warm_ids, state=JobState.SUCCEEDED).count() == 600,
        what="the short jobs",
    )
    # Long enough for the second worker's start-up: the first takes its two
    # given-back jobs itself once its own two end.
    long = enqueue_many(
        tasks.sleep_then_record, [((f"long-{i}", 4.0), {}) for i in range(4)], return_results=True
    )
    wait_until(lambda: SideEffect.objects.filter(note="start").count() >= 2, what="two starts")
    second = start_worker("--concurrency", "2")
    wait_until(
        lambda: SideEffect.objects.filter(note="end").count() == 4, timeout=30, what="4 ends"
    )
    pids = set(SideEffect.objects.filter(note="end").values_list("worker_pid", flat=True))
    assert pids == {first.pid, second.pid}, pids
    for result in long:
        assert tasks.sleep_then_record.get_result(result.id).attempts == 1


def queued(running: RunningJob, on_loop: bool = False) -> RunningJob:
    """A success handed to the completer, waiting for a wave to take it."""
    running.on_loop, running.finished = on_loop, Outcome("succeeded")
    running.on_persisted = lambda: None
    return running


def test_successes_queued_for_a_later_wave_keep_their_slot():
    """A wave writes at most COMPLETION_BATCH successes: counting every queued
    success free would let a worker with hundreds of async slots lease jobs
    faster than its waves write them, without bound. Only those the wave being
    written took (``in_wave``) free their slots."""
    from django_dispatch.runtime.slots import COMPLETION_BATCH

    slots = Slots(8, async_concurrency=1000)
    slots.async_share = 1.0
    assert slots.free() == 8 + 1000
    assert COMPLETION_BATCH < 1000
    for n in range(1, 1001):  # every slot's job ended, its success queued
        slots.running[n] = queued(fake_running(n), on_loop=True)
    assert slots.free() == 8  # the threads only
    for n in range(1, COMPLETION_BATCH + 1):  # the wave being written took these
        slots.running[n].in_wave = True
    assert slots.free() == 8 + COMPLETION_BATCH
    slots.running[COMPLETION_BATCH + 1].withdrawn = True  # the watchdog writes it
    assert slots.free() == 8 + COMPLETION_BATCH + 1
    threads_only = Slots(8)
    threads_only.running = {n: queued(fake_running(n)) for n in range(1, 11)}
    assert threads_only.free() == 0  # 10 queued: more than the 8 threads
    for running in list(threads_only.running.values())[:4]:
        running.in_wave = True
    assert threads_only.free() == 2
