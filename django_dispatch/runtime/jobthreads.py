"""The job threads of a worker: where task code runs, one job at a time per thread.

``JobRunner`` is what a job thread does with one claimed job: make sure its
connection works (``connections``), run one attempt (``attempt``, which the
pure ``executor`` classifies; ``atomic`` for an atomic task, whose success
commits with its body), hand the outcome to the completer (a success
joins the next wave, anything else is written at once), and free its slot
(``slots``). ``JobThreads`` is the pool of long-lived threads, each keeping
its database connection from one job to the next.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import KW_ONLY, dataclass

from django.db import DatabaseError, InterfaceError, connections

from .. import store
from ..observability import joblog, tracing
from . import atomic, attempt, completer, executor, metering, timeouts
from .connections import ThreadConnections, database_went_away
from .executor import Outcome
from .running import RunningJob
from .slots import Slots

logger = logging.getLogger("django_dispatch.worker")


@dataclass(eq=False)
class JobRunner:
    """Runs one claimed job on the calling thread, from connection check to freed slot."""

    slots: Slots
    overseer: timeouts.Overseer
    completer: completer.BatchCompleter
    _: KW_ONLY
    lease_seconds: float
    db: str

    def run(self, running: RunningJob, conns: ThreadConnections) -> None:
        """On a job thread: check the connection, run, persist, free the slot."""
        if not self.register(running):
            return
        outcome: Outcome | None = None
        meter: metering.Meter | None = None
        handed_over = False
        try:
            meter = self.begin(running, conns)
            if meter is None:
                outcome = Outcome(kind="released")
                return
            if tracing.AVAILABLE and tracing.active():  # a consumer span, under the enqueue's
                with tracing.consumer(running.claimed) as span:
                    outcome = self._attempt(running)
                    tracing.outcome(span, outcome.kind, outcome.exception)
            else:
                outcome = self._attempt(running)
            self.ran(running, meter)
            if running.persisted:  # an atomic success: committed with its body, or lost
                atomic.report(running, outcome)
                return
            handed_over = self.completer.hand_over(running, outcome, meter)
            if handed_over:
                meter = None  # the reporter drops it, once the wave wrote the usage record
            else:
                self.write(running, outcome)
        except Exception as e:
            outcome = self.unexpected(running, e)
        finally:
            self.end(running, outcome, meter, conns, written=not handed_over)

    # The steps of a job, shared with the asyncio executor (``asyncjobs``),
    # which runs the same steps with task code on its event loop.

    def register(self, running: RunningJob) -> bool:
        """Mark the job started on this thread; False: it was handed back meanwhile."""
        with self.slots.lock:
            if running.abandoned:  # handed back before a thread picked it up
                return False
            self.slots.threads[running.claimed.id] = threading.current_thread()
            running.begun_at = time.monotonic()
        return True

    def register_many(self, jobs: list[RunningJob]) -> list[RunningJob]:
        """``register`` of a claim's jobs, all started on the calling thread (the
        event loop's), under one hold of the slots' lock: the control loop holds
        it while it counts the slots, and taking it once per job of a wave of
        hundreds made the loop wait on it as often. The jobs not handed back."""
        thread, now = threading.current_thread(), time.monotonic()
        started: list[RunningJob] = []
        with self.slots.lock:
            threads = self.slots.threads
            for running in jobs:
                if running.abandoned:  # handed back before the loop picked it up
                    continue
                threads[running.claimed.lease.job_id] = thread
                running.begun_at = now
                started.append(running)
        return started

    def begin(
        self, running: RunningJob, conns: ThreadConnections, *, check: bool = True
    ) -> metering.Meter | None:
        """Before task code: a usable connection, the task resolved, the clocks started.

        None when the database is unreachable: task code has not started, so
        the job goes back as if never claimed (written once the database
        answers, or reclaimed if it never does); logged as "released".
        ``check`` False: the caller proved this thread's connections usable
        since the last task code that ran on it (the asyncio executor, once
        for the many jobs of one hop).
        """
        try:
            if check:
                conns.ready_for_task(self.db)
        except (DatabaseError, InterfaceError):
            database_went_away()
            completer.persist(
                running.claimed, Outcome(kind="released"), give_up_after=self.lease_seconds
            )
            return None
        task = attempt.resolve(running)  # once per job: the timeouts use it too
        joblog.started(running.claimed)
        # The attempt's usage record: an async task's CPU is not this thread's.
        return metering.start(
            running.claimed.id, thread_cpu=task is None or not attempt.is_coroutine(task.func)
        )

    def ran(self, running: RunningJob, meter: metering.Meter) -> None:
        meter.stop()
        joblog.ran(running.claimed, meter.wall or 0.0)
        self.slots.ran(meter.wall or 0.0)

    def write(self, running: RunningJob, outcome: Outcome) -> None:
        """Write an outcome the completion wave did not take, one job at a time."""
        # An abandoned job's outcome was recorded by whoever abandoned
        # it (the hand-back, the timeout, the recycle's successor).
        completer.persist(
            running.claimed,
            outcome,
            give_up_after=self.lease_seconds,
            report=not running.abandoned,
        )

    @staticmethod
    def unexpected(running: RunningJob, e: Exception) -> Outcome:
        """A bug of ours must not kill the thread, nor leave the job running
        until its lease expires: fail it (fenced) and go on."""
        job_id = running.claimed.id
        logger.exception(
            "job %s: unexpected error in the worker",
            job_id,
            extra=joblog.job_fields(running.claimed),
        )
        outcome = executor.classify_failure(running.claimed, e, task=None, policy=None)
        try:
            completer.persist(running.claimed, outcome, give_up_after=1)
        except Exception:
            logger.exception("job %s: could not record the error", job_id)
        return outcome

    def end(
        self,
        running: RunningJob,
        outcome: Outcome | None,
        meter: metering.Meter | None,
        conns: ThreadConnections,
        *,
        written: bool = True,
    ) -> None:
        """Whatever happened: reset this thread's connections and free the slot.

        A success handed to the wave (``written`` False) stays among the
        worker's jobs, its lease renewed, until the wave writes it: its slot
        is freed by that wave, and the hand-over already woke the control
        loop (``BatchCompleter.offer``), so it is not woken again here.
        """
        job_id = running.claimed.id
        if outcome is not None and outcome.kind == "interrupted":
            database_went_away()  # the other threads' connections may be broken too
        metering.forget(job_id, meter)
        conns.end_job(self.db)
        with self.slots.lock:
            if written and self.slots.running.get(job_id) is running:
                del self.slots.running[job_id]
            self.slots.threads.pop(job_id, None)
            self.slots.lingering.pop(job_id, None)
        if written:
            self.completer.wake()  # the control loop: a slot is free

    def _attempt(self, running: RunningJob) -> Outcome:
        """Run the task once; the outcome, as its timeout or a hand-back changed it."""
        self.overseer.started(running)
        if getattr(running.task, "atomic", False):
            outcome = atomic.execute(running.claimed, running, self.db)
            if running.persisted:  # written with the body: what the timeout says comes too late
                self.overseer.returned(running)
                return outcome
        else:
            outcome = attempt.execute(running.claimed, running)
        return self.finish_attempt(running, outcome)

    def finish_attempt(self, running: RunningJob, outcome: Outcome) -> Outcome:
        """The attempt's outcome, as its timeout or a hand-back changed it."""
        overtime = self.overseer.returned(running)
        if running.abandoned:
            return Outcome(kind="discarded", task_result=outcome.task_result)
        if overtime is not None and overtime.reason == "timeout":
            # Stopped within the grace period; the lease was held meanwhile.
            return timeouts.timeout_outcome(
                running.claimed,
                overtime.timeout,
                how="it was asked to stop, and did",
                task=running.task,
            )
        return outcome


class JobThreads:
    """Long-lived job threads, each keeping its own database connection.

    In a worker that cannot recycle its process, a thread given up on after a
    timeout is *retired*: it no longer counts as a slot, finishes its task
    function in the background, gets its late write rejected by the fence,
    and exits. A fresh thread takes its place so the worker keeps its
    concurrency.
    """

    def __init__(self, runner: JobRunner, size: int) -> None:
        self.runner = runner
        self.inbox: queue.SimpleQueue[RunningJob | None] = queue.SimpleQueue()
        self.retired: set[threading.Thread] = set()
        self.threads: list[threading.Thread] = []
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(
            target=store.carrying_database(self._loop), name="dispatch-job", daemon=True
        )
        self.threads.append(thread)
        thread.start()

    def submit(self, running: RunningJob) -> None:
        self.inbox.put(running)

    def retire(self, thread: threading.Thread | None) -> None:
        if thread is not None and thread in self.threads:
            self.threads.remove(thread)
            self.retired.add(thread)
            self._spawn()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop idle threads and wait for them (retired ones may be stuck in task code)."""
        for _ in self.threads:
            self.inbox.put(None)
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        me = threading.current_thread()
        conns = ThreadConnections(exclusive=True)  # nothing but its jobs runs here
        try:
            while me not in self.retired:
                running = self.inbox.get()
                if running is None:
                    return
                try:
                    self.runner.run(running, conns)
                except BaseException:  # never lose a job thread silently
                    logger.exception("job thread crashed; it carries on")
        finally:
            connections.close_all()
