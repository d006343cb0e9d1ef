"""The asyncio executor (``rundispatch --async-concurrency N``, #20): async jobs of
one process run together on one event loop, with the job thread's guarantees.

Concurrency is proven by the jobs' own clocks (how many windows overlap), never
by how long a test took.
"""

import gc
import logging
import signal
import time
from collections.abc import Callable

import pytest
from django.db import connection

from django_dispatch import cancel, enqueue_many
from django_dispatch.compat import TaskResultStatus, task_finished, task_started
from django_dispatch.models import Job
from django_dispatch.runtime.asyncjobs import AsyncJobs
from django_dispatch.runtime.connections import ThreadConnections
from django_dispatch.runtime.running import RunningJob
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from tests.conftest import ON_POSTGRES, wait_until
from tests.testapp import async_tasks, tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def most_at_once(windows: list[dict]) -> int:
    """The largest number of [start, end) windows that overlap at one instant."""
    edges = sorted(
        [(w["start"], 1) for w in windows] + [(w["end"], -1) for w in windows],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    now = best = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def results(task, enqueued) -> list:
    return [task.get_result(e.id) for e in enqueued]


def test_async_jobs_run_together_on_one_event_loop():
    """60 jobs of 0.3 s with 2 threads: far more than 2 ran at once, all on the loop."""
    enqueued = [async_tasks.window.enqueue(0.3) for _ in range(60)]
    assert drain(concurrency=2, async_concurrency=60) == 60
    done = results(async_tasks.window, enqueued)
    assert {r.status for r in done} == {TaskResultStatus.SUCCESSFUL}
    windows = [r.return_value for r in done]
    assert {w["thread"] for w in windows} == {"dispatch-async"}
    assert most_at_once(windows) >= 20  # threads alone: at most 2


def test_without_the_flag_an_async_job_takes_a_thread():
    """The control case: the same jobs, no asyncio executor, at most 2 at once."""
    enqueued = [async_tasks.window.enqueue(0.05) for _ in range(8)]
    drain(concurrency=2)
    windows = [r.return_value for r in results(async_tasks.window, enqueued)]
    assert most_at_once(windows) <= 2
    assert "dispatch-async" not in {w["thread"] for w in windows}


def test_sync_jobs_beside_async_ones_run_on_threads_each_once():
    sync = [async_tasks.sync_window.enqueue(0.02) for _ in range(20)]
    asyn = [async_tasks.window.enqueue(0.05) for _ in range(20)]
    assert drain(concurrency=2, async_concurrency=20) == 40
    sync_done = results(async_tasks.sync_window, sync)
    async_done = results(async_tasks.window, asyn)
    assert all(r.status == TaskResultStatus.SUCCESSFUL for r in sync_done + async_done)
    assert {r.return_value["thread"] for r in sync_done} == {"dispatch-job"}
    assert {r.return_value["thread"] for r in async_done} == {"dispatch-async"}
    assert all(r.attempts == 1 for r in sync_done + async_done)


def test_a_settled_async_job_leaves_nothing_to_the_cyclic_gc():
    """A job's objects die with its last use: a job left in a reference cycle
    waits, with its row and outcome, for the cyclic GC, whose collections
    grow with the jobs in flight."""
    enqueue_many(async_tasks.sleeps, [((0.01,), {}) for _ in range(30)])
    assert _jobs_left_to_the_cyclic_gc(lambda: drain(concurrency=2, async_concurrency=30)) == []


def test_a_settled_thread_job_leaves_nothing_to_the_cyclic_gc():
    """The same for a sync job whose success joined a wave from its thread."""
    enqueued = [async_tasks.sync_window.enqueue(0.0) for _ in range(30)]
    assert _jobs_left_to_the_cyclic_gc(lambda: drain(concurrency=2)) == []
    assert all(r.attempts == 1 for r in results(async_tasks.sync_window, enqueued))


def test_async_orm_writes_land_once_each_through_one_connection():
    """40 jobs at once, each writing one uniquely keyed row through the ORM:
    every row lands exactly once, and on PostgreSQL all through one session,
    however many jobs ran together (the executor adds one connection)."""
    enqueued = [async_tasks.orm_write.enqueue(f"orm-{i}") for i in range(40)]
    assert drain(concurrency=2, async_concurrency=40) == 40
    done = results(async_tasks.orm_write, enqueued)
    assert {r.status for r in done} == {TaskResultStatus.SUCCESSFUL}
    assert Execution.objects.filter(key__startswith="orm-").count() == 40
    if connection.vendor == "postgresql":
        assert len({r.return_value for r in done}) == 1


def test_the_connection_check_runs_once_per_hop_and_again_after_user_code(monkeypatch):
    """The steps of many jobs go to the sync thread in one hop: its connection is
    checked once for them all, unless a ``task_started`` receiver (user code)
    ran on it, after which the next job's check runs again."""
    # What the sync thread did, in order: a job's first step ("step", its hop), an end
    # ("end"), a connection check ("check").
    events: list[tuple[str, int]] = []
    real = ThreadConnections.ready_for_task
    before, after = AsyncJobs._before, AsyncJobs._after

    def counted(self, db):
        events.append(("check", 0))
        return real(self, db)

    def counted_before(self, running):
        events.append(("step", self.hops.count))
        return before(self, running)

    def counted_after(self, *args):
        events.append(("end", 0))
        return after(self, *args)

    monkeypatch.setattr(ThreadConnections, "ready_for_task", counted)
    monkeypatch.setattr(AsyncJobs, "_before", counted_before)
    monkeypatch.setattr(AsyncJobs, "_after", counted_after)

    def checks() -> list[tuple[str, int]]:
        return [e for e in events if e[0] == "check"]

    def wrong_checks() -> tuple[int, int]:
        """(checks with no new hop and no end since the last one, a job's first step
        with one of those behind it and no check of its own before the next event)."""
        needless = missing = 0
        due, hop, expecting = True, None, False
        for kind, n in events:
            if kind == "check":
                needless += not due
                due = expecting = False
                continue
            missing += expecting
            expecting = False
            if kind == "end":
                due = True
            elif kind == "step":
                if n != hop:
                    due, hop = True, n
                expecting = due
        return needless, missing + expecting

    tasks_log = logging.getLogger("django.tasks")  # its receivers then observe nothing
    level = tasks_log.level
    tasks_log.setLevel(logging.WARNING)
    # A ``task_finished`` receiver runs in the job's end, after which a check is due
    # anyway: it must not make each job's start check again (other test modules
    # connect one at import, so the whole suite runs with one).
    task_finished.connect(finished := lambda **kwargs: None)
    try:
        enqueued = [async_tasks.window.enqueue(0.05) for _ in range(40)]
        assert drain(concurrency=2, async_concurrency=40) == 40
    finally:
        tasks_log.setLevel(level)
        task_finished.disconnect(finished)
    assert {r.status for r in results(async_tasks.window, enqueued)} == {
        TaskResultStatus.SUCCESSFUL
    }
    # One per hop, and again after an end; how many jobs a hop carries depends on the
    # machine's load (a hop of one job each checks for each, rightly).
    assert wrong_checks() == (0, 0), events

    events.clear()
    task_started.connect(receiver := lambda **kwargs: None)
    try:
        enqueued = [async_tasks.window.enqueue(0.05) for _ in range(10)]
        assert drain(concurrency=2, async_concurrency=10) == 10
    finally:
        task_started.disconnect(receiver)
    assert len(checks()) >= 10  # a receiver ran before each job's check


def test_a_receiver_connected_by_user_code_is_sent_to_for_every_later_job(monkeypatch):
    """Whether a job's signals are observed is looked up once per hop, not per job:
    a ``task_finished`` receiver (user code, run in a job's end on the sync thread,
    in the same hop as other jobs' starts) that connects a ``task_started``
    receiver has it sent for every job prepared after that."""
    events: list[tuple[str, int]] = []  # in the sync thread's order
    before = AsyncJobs._before

    def logged_before(self, running):
        result = before(self, running)
        events.append(("prepared", running.claimed.id))
        return result

    def started(sender, task_result, **kwargs):
        events.append(("started", int(task_result.id)))

    def finished(**kwargs):
        if ("connected", 0) not in events:
            task_started.connect(started)
            events.append(("connected", 0))

    monkeypatch.setattr(AsyncJobs, "_before", logged_before)
    tasks_log = logging.getLogger("django.tasks")  # until then, task_started is silent
    level = tasks_log.level
    tasks_log.setLevel(logging.WARNING)
    task_finished.connect(finished)
    try:
        enqueued = [async_tasks.window.enqueue(0.02) for _ in range(60)]
        assert drain(concurrency=1, async_concurrency=6) == 60
    finally:
        tasks_log.setLevel(level)
        task_finished.disconnect(finished)
        task_started.disconnect(started)
    kinds = [kind for kind, _ in events]
    assert "connected" in kinds
    after = events[kinds.index("connected") :]
    prepared = {n for kind, n in after if kind == "prepared"}
    assert prepared  # jobs were still starting when it connected
    assert prepared <= {n for kind, n in events if kind == "started"}
    assert len(enqueued) == 60


def test_a_timeout_on_the_loop_fails_that_job_only():
    late = async_tasks.overtime.enqueue(5)
    others = [async_tasks.window.enqueue(0.2) for _ in range(10)]
    drain(concurrency=1, async_concurrency=20)
    result = async_tasks.overtime.get_result(late.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "django_dispatch.exceptions.TaskTimeout"
    assert {r.status for r in results(async_tasks.window, others)} == {TaskResultStatus.SUCCESSFUL}


def test_an_error_is_retried_under_the_tasks_policy():
    enqueued = async_tasks.fails_first.enqueue("flaky")
    drain(async_concurrency=5)
    result = async_tasks.fails_first.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2 and result.attempts == 2
    assert "ValueError" in result.errors[0].exception_class_path


def test_cancelling_a_running_async_job_stops_it_and_spares_the_others(start_worker):
    victim = async_tasks.sleeps.enqueue(30, key="victim")
    sibling = async_tasks.sleeps.enqueue(1.0, key="sibling")
    worker = start_worker(
        "--async-concurrency", "10", "--concurrency", "1", overrides={"HEARTBEAT_INTERVAL": 0.2}
    )
    wait_until(
        lambda: Job.objects.filter(pk=victim.id, state=JobState.RUNNING).exists(),
        what="the long job to start",
    )
    assert cancel(victim.id)
    wait_until(
        lambda: (
            Job.objects.get(pk=victim.id).state == JobState.CANCELLED
            and Job.objects.get(pk=sibling.id).state == JobState.SUCCEEDED
        ),
        what=f"cancel to land and the sibling to finish:\n{worker.output()}",
    )
    assert not Execution.objects.filter(key="victim").exists()  # it never got past its sleep
    assert Execution.objects.filter(key="sibling").count() == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_sigterm_lets_async_jobs_finish_or_hands_them_back(start_worker):
    """Short jobs finish inside the shutdown timeout; long ones go back to the
    queue without spending an attempt, and nothing is written for them."""
    short = [async_tasks.sleeps.enqueue(0.5, key=f"short-{i}") for i in range(10)]
    long = [async_tasks.sleeps.enqueue(60, key=f"long-{i}") for i in range(10)]
    worker = start_worker(
        "--async-concurrency", "50", "--concurrency", "1", "--shutdown-timeout", "2"
    )
    ids = [e.id for e in short + long]
    wait_until(
        lambda: Job.objects.filter(pk__in=ids, state=JobState.RUNNING).count() == 20,
        what=f"all 20 jobs to run at once:\n{worker.output()}",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert {Job.objects.get(pk=e.id).state for e in short} == {JobState.SUCCEEDED}
    assert Execution.objects.filter(key__startswith="short-").count() == 10
    for e in long:
        job = Job.objects.get(pk=e.id)
        assert job.state == JobState.PENDING and job.attempts == 0, (job.state, job.attempts)
    assert not Execution.objects.filter(key__startswith="long-").exists()


def test_a_worker_with_many_async_slots_does_not_hoard_sync_jobs(start_worker):
    """The claim cannot ask for async jobs only. A queue of sync jobs must not
    be claimed 50 at a time by a worker with 50 async slots and one thread."""
    enqueued = [async_tasks.sync_window.enqueue(0.05) for _ in range(60)]
    ids = [e.id for e in enqueued]
    worker = start_worker("--async-concurrency", "50", "--concurrency", "1", "--burst")
    most = 0
    while worker.popen.poll() is None:
        most = max(most, Job.objects.filter(pk__in=ids, state=JobState.RUNNING).count())
    assert worker.wait() == 0
    assert Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() == 60
    # One thread + the first claim's probe of the loop (a quarter of 50) at most.
    assert most <= 1 + 13, most


def test_two_processes_drain_a_mixed_backlog_each_job_once(start_worker):
    """``rundispatch --processes 2`` with async slots: a backlog of async and sync
    jobs, interleaved, drains; each job runs once, both processes take part, and
    each kind runs where it belongs (the event loop, the job threads)."""
    n = 300 if ON_POSTGRES else 60
    enqueued: dict[str, list[str]] = {"async": [], "sync": [], "record": []}
    for start in range(0, n, 10):
        enqueued["async"] += enqueue_many(
            async_tasks.sleeps, [((0.02, f"async-{i}"), {}) for i in range(start, start + 10)]
        )
        enqueued["sync"] += enqueue_many(
            async_tasks.sync_window, [((0.001,), {}) for _ in range(start, start + 10)]
        )
        enqueued["record"] += enqueue_many(tasks.record, [((f"sync-{start}",), {})])
    worker = start_worker(
        "--processes", "2", "--concurrency", "2", "--async-concurrency", "50", "--burst"
    )
    assert worker.wait(180) == 0, worker.output()
    jobs = Job.objects.filter(pk__in=[i for kind in enqueued.values() for i in kind])
    assert {(j.state, j.attempts) for j in jobs} == {(JobState.SUCCEEDED, 1)}, worker.output()
    assert Execution.objects.filter(key__startswith="async-").count() == n
    assert Execution.objects.filter(key__startswith="sync-").count() == n // 10
    assert Execution.objects.values("worker_pid").distinct().count() == 2
    windows = [async_tasks.sync_window.get_result(i).return_value for i in enqueued["sync"]]
    assert {w["thread"] for w in windows} == {"dispatch-job"}


def test_a_worker_never_holds_more_leased_jobs_than_its_slots(start_worker):
    """A worker holds at most its async slots, its threads and what it claims
    ahead of them, leased. Jobs leased and not started would sit out their
    lease if the worker died, and other workers starve meanwhile. Two ways
    past it: successes queued for a later wave counted as free slots (a wave
    writes at most ``PG_WAVE`` of them on PostgreSQL, ``COMPLETION_BATCH``
    elsewhere, and more jobs than that end at once here), and claims for the
    free threads that bring in async jobs while the loop is full, one turn
    after another.

    One process, 1 thread and 100 async slots more than a wave writes; a job
    is leased (``running``) from its claim to its wave's commit."""
    from django_dispatch.runtime.slots import COMPLETION_BATCH, PG_WAVE

    wave = PG_WAVE if ON_POSTGRES else COMPLETION_BATCH
    slots, threads = wave + 100, 1  # one wave cannot write all their successes
    n = 3 * slots if ON_POSTGRES else 4 * slots
    for start in range(0, n, 500):
        enqueue_many(async_tasks.sleeps, [((0.1,), {}) for _ in range(start, min(n, start + 500))])
    # A lease long enough that a slow machine does not lose one (and run its
    # job twice) while hundreds of successes wait for their wave.
    worker = start_worker(
        "--async-concurrency",
        str(slots),
        "--concurrency",
        str(threads),
        "--burst",
        overrides={"LEASE_SECONDS": 30},
    )
    most, deadline = 0, time.monotonic() + 180
    while worker.popen.poll() is None and time.monotonic() < deadline:
        most = max(most, Job.objects.filter(state=JobState.RUNNING).count())
    assert worker.wait(10) == 0, worker.output()  # stops the worker if it is still running
    assert Job.objects.filter(state=JobState.SUCCEEDED, attempts=1).count() == n
    # The slots and the thread, with room for one more job per thread (these
    # 0.1 s jobs are longer than the short mark, so none is claimed ahead).
    assert most <= slots + 2 * threads, most


def _jobs_left_to_the_cyclic_gc(drain_them: Callable[[], int]) -> list[RunningJob]:
    """The jobs that only the cyclic GC would free once ``drain_them()`` (which
    must drain 30 jobs) is over: the GC is off meanwhile, then collects into
    ``gc.garbage``."""
    gc.collect()
    gc.disable()
    try:
        assert drain_them() == 30
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return [o for o in gc.garbage if isinstance(o, RunningJob)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
