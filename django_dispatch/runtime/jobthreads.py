"""The job threads of a worker: where task code runs, one job at a time per thread.

``Slots`` is the state the control loop and the job threads share: the jobs
this process holds, under one lock. ``JobRunner`` is what a job thread does
with one claimed job: make sure its connection works (``connections``), run
it (``executor``), persist the outcome (``completer``: a success joins the
next wave, anything else is written at once), and free its slot.
``JobThreads`` is the pool of long-lived threads, each keeping its database
connection from one job to the next.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from functools import partial
from inspect import iscoroutinefunction

from django.db import DatabaseError, InterfaceError, connections

from ..observability import events, tracing
from ..resources import minus
from ..store.resources import SHAPES_TTL, Placement, ShapeCache
from . import completer, executor, metering, timeouts
from .connections import ThreadConnections, database_went_away
from .executor import Outcome, RunningJob

logger = logging.getLogger("django_dispatch.worker")


#: While every recent job ran shorter than this, jobs are claimed ahead of free threads.
PREFETCH_JOB_SECONDS = 0.05
#: How fast a long job is forgotten: the slowest recent run shrinks by this
#: factor per job that ends (a 1 s job stops claiming ahead for ~300 jobs).
SLOWEST_DECAY = 0.99


class Slots:
    """The jobs a worker process holds, shared by its control loop and its job threads."""

    def __init__(self, concurrency: int, async_concurrency: int = 0, prefetch: int = 0) -> None:
        self.concurrency = concurrency
        #: Jobs claimed ahead of free threads while jobs are short (see ``free``).
        self.prefetch = prefetch
        #: The slowest recent run of a task here, decaying (see ``ran``); None
        #: before the first.
        self.job_seconds: float | None = None
        #: Set once the worker stops claiming: nothing more is claimed ahead.
        self.stopping = False
        #: Whether jobs claimed ahead wait for a thread (``behind_long_jobs``):
        #: the control loop then looks again within ``PREFETCH_JOB_SECONDS``.
        self.holding_ahead = False
        #: Slots of the asyncio executor (``rundispatch --async-concurrency``).
        self.async_concurrency = async_concurrency
        #: Share of async jobs in the last claim: how much of the event
        #: loop's free room the next claim asks for (see ``free``).
        self.async_share = 0.25
        self.lock = threading.Lock()
        self.running: dict[int, RunningJob] = {}
        #: The thread running each job, once one picked it up.
        self.threads: dict[int, threading.Thread] = {}
        #: The shapes of jobs with needs pending, as last read (#16).
        self.shapes = ShapeCache(SHAPES_TTL)
        #: Jobs given up on whose task code still runs on a retired thread:
        #: no slot, but they still hold their resources until they return.
        self.lingering: dict[int, RunningJob] = {}

    def free(self) -> int:
        """How many jobs the next claim may take.

        A success waiting for its wave holds no slot: its thread has gone on
        (``JobRunner.hand_over``), and the wave that writes it is written in
        the claim's transaction.

        With an asyncio executor, a claim cannot ask for async jobs only: it
        learns which task a job runs once it has it. It asks for the free
        threads plus the share of the event loop's free room that async jobs
        took in the last claim (at least one, to notice a change), and for
        nothing while sync jobs wait for a thread. So jobs sit claimed and
        unstarted (leased, renewed, handed back at shutdown) only briefly,
        and a queue of sync jobs is not hoarded by a worker that has 200
        async slots and 8 threads.
        """
        threads = self.concurrency + self.ahead()
        with self.lock:
            busy = [r for r in self.running.values() if r.finished is None]
            if not self.async_concurrency:
                return threads - len(busy)
            on_loop = sum(1 for r in busy if r.on_loop)
            threads_free = threads - (len(busy) - on_loop)
            loop_free = self.async_concurrency - on_loop
            if threads_free < 0 or loop_free <= 0:
                return max(0, threads_free)
            return threads_free + max(1, round(loop_free * self.async_share))

    def ahead(self) -> int:
        """How many jobs to hold claimed beyond the threads, ready for the next free one.

        A thread that finishes a short job takes the next at once instead of
        waiting a round trip for the claim that refills its slot; that wave's
        claim then refills the buffer. Only while every recent job was short:
        a long job claimed ahead would sit leased and unstarted behind a
        running one while another worker could run it. So the measure is the
        slowest recent job, not an average that a queue of short jobs would
        keep low while a long one hides in it. Never before the first job's
        length is known, nor once the worker stops.
        """
        seconds = self.job_seconds
        if self.stopping or seconds is None or seconds >= PREFETCH_JOB_SECONDS:
            return 0
        return self.prefetch

    def ran(self, seconds: float) -> None:
        """A task ran ``seconds`` (any thread; a lost update is harmless).

        The slowest recent run, decaying by ``SLOWEST_DECAY`` per job: one
        long job stops the claims ahead at once, and only a few hundred short
        ones bring them back.
        """
        old = self.job_seconds
        self.job_seconds = seconds if old is None else max(seconds, old * SLOWEST_DECAY)

    def behind_long_jobs(self) -> list[RunningJob]:
        """The jobs claimed ahead that now wait behind a long job, taken out of
        the slots and marked abandoned for the caller to hand back.

        The slowest recent job cannot foresee a task that has not run here
        yet: a worker that knew only short jobs may claim a long one ahead,
        or claim short ones ahead of a long one now running. Both would sit
        leased and unstarted while another worker could run them. So a thread
        job still running past ``PREFETCH_JOB_SECONDS`` counts as a long run
        (``ran``: nothing more is claimed ahead), and the jobs held beyond the
        idle threads go back to the queue at once, without spending an
        attempt (the newest first: the threads take the oldest next).

        Not with an asyncio executor: there, sync jobs claimed through the
        event loop's share may wait for a thread by design (see ``free``,
        which bounds them); handing them back would only have the next claim
        take them again.
        """
        if self.async_concurrency or not self.prefetch:
            return []  # nothing is ever held ahead of the threads
        now = time.monotonic()
        with self.lock:
            unstarted: list[RunningJob] = []
            busy = 0
            longest = 0.0
            for running in self.running.values():
                if running.on_loop or running.finished is not None:
                    continue
                if running.begun_at is None:
                    unstarted.append(running)
                else:
                    busy += 1
                    longest = max(longest, now - running.begun_at)
            excess = len(unstarted) - max(0, self.concurrency - busy)
            self.holding_ahead = excess > 0
            if longest < PREFETCH_JOB_SECONDS:
                return []  # they wait behind short jobs: a thread takes them soon
            self.ran(longest)
            if excess <= 0:
                return []
            self.holding_ahead = False
            return self._abandon(unstarted[-excess:])

    def take_unstarted(self) -> list[RunningJob]:
        """At a stop: every thread job no thread has started (claimed ahead),
        taken out of the slots and marked abandoned for the caller to hand back."""
        with self.lock:
            return self._abandon(
                [
                    running
                    for running in self.running.values()
                    if running.begun_at is None and running.finished is None and not running.on_loop
                ]
            )

    def _abandon(self, unstarted: list[RunningJob]) -> list[RunningJob]:
        """Under ``lock``: take jobs no thread started out of the slots. A thread
        that picks one up afterwards skips it (``JobRunner.register``)."""
        for running in unstarted:
            running.abandoned = True
            del self.running[running.claimed.id]
        return unstarted

    def learn(self, on_loop: int, claimed: int) -> None:
        """After a claim of ``claimed`` jobs, ``on_loop`` of them async."""
        if claimed:
            self.async_share = on_loop / claimed

    def placement(
        self, capacity: dict[str, int], locality: str, starvation_seconds: float
    ) -> Placement | None:
        """What the next claim may take (#16): None without capacity or locality
        (the claim as before); else the capacity less what running jobs hold.
        Jobs whose success waits in the completion wave hold nothing: the claim
        that writes their wave frees their slots too."""
        if not capacity and not locality:
            return None
        held: dict[str, int] = {}
        with self.lock:
            for running in [*self.running.values(), *self.lingering.values()]:
                if running.finished is None:
                    held = minus(held, running.claimed.row.get("resources"))
        return Placement(
            capacity=capacity,
            locality=locality or None,
            held={name: -amount for name, amount in held.items()},
            starvation_seconds=starvation_seconds,
            cache=self.shapes,
        )


class JobRunner:
    """Runs one claimed job on the calling thread, from connection check to freed slot."""

    def __init__(
        self,
        slots: Slots,
        overseer: timeouts.Overseer,
        batch: completer.BatchCompleter,
        *,
        lease_seconds: float,
        db: str,
        wakeup: threading.Event,
        reporter: completer.Reporter,
    ) -> None:
        self.slots = slots
        #: Reports a success once its wave is written: the thread does not wait.
        self.reporter = reporter
        self.overseer = overseer
        self.completer = batch
        self.lease_seconds = lease_seconds
        self.db = db
        self.wakeup = wakeup

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
            handed_over = self.hand_over(running, outcome, meter)
            if handed_over:
                meter = None  # the reporter drops it, once the wave wrote the usage record
            else:
                self.write(running, outcome)
        except Exception as e:
            outcome = self.unexpected(running, e)
        finally:
            self.end(running, outcome, meter, conns, written=not handed_over)

    def hand_over(self, running: RunningJob, outcome: Outcome, meter: metering.Meter) -> bool:
        """A success joins the next wave and this thread goes on to its next job;
        the reporter does the rest once the wave is written (see ``Reporter``).

        False (the caller writes and reports it itself) for anything but a
        success, and while the reporter is behind (``Reporter.behind``).
        """
        if outcome.kind != "succeeded" or self.reporter.behind():
            return False
        running.meter = meter
        running.on_persisted = partial(self.reporter.put, running)
        return self.completer.offer(running, outcome)

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

    def begin(self, running: RunningJob, conns: ThreadConnections) -> metering.Meter | None:
        """Before task code: a usable connection, the task resolved, the clocks started.

        None when the database is unreachable: task code has not started, so
        the job goes back as if never claimed (written once the database
        answers, or reclaimed if it never does); logged as "released".
        """
        try:
            conns.ready_for_task(self.db)
        except (DatabaseError, InterfaceError):
            database_went_away()
            completer.persist(
                running.claimed, Outcome(kind="released"), give_up_after=self.lease_seconds
            )
            return None
        task = executor.resolve(running)  # once per job: the timeouts use it too
        events.started(running.claimed)
        # The attempt's usage record (#16): an async task's CPU is not this thread's.
        return metering.start(
            running.claimed.id, thread_cpu=task is None or not iscoroutinefunction(task.func)
        )

    def ran(self, running: RunningJob, meter: metering.Meter) -> None:
        meter.stop()
        events.ran(running.claimed, meter.wall or 0.0)
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
            extra=events.job_fields(running.claimed),
        )
        outcome = executor.classify_failure(running.claimed, e, task=None, retryable=False)
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
        worker's jobs, its lease renewed, until the wave writes it.
        """
        job_id = running.claimed.id
        if outcome is not None and outcome.kind == "interrupted":
            database_went_away()  # the other threads' connections may be broken too
        metering.forget(job_id, meter)
        _reset_connections()
        conns.done()
        with self.slots.lock:
            if written and self.slots.running.get(job_id) is running:
                del self.slots.running[job_id]
            self.slots.threads.pop(job_id, None)
            self.slots.lingering.pop(job_id, None)
        self.wakeup.set()

    def _attempt(self, running: RunningJob) -> Outcome:
        """Run the task once; the outcome, as its timeout or a hand-back changed it."""
        self.overseer.started(running)
        outcome = executor.execute(running.claimed, running)
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


def _reset_connections() -> None:
    """Keep a job thread's connection across jobs unless a task broke it."""
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            logger.error("a task left a transaction open; rolling it back")
            conn.close()
        elif conn.errors_occurred and not conn.is_usable():
            conn.close()
        else:
            conn.errors_occurred = False


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
        thread = threading.Thread(target=self._loop, name="dispatch-job", daemon=True)
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
        conns = ThreadConnections()
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
