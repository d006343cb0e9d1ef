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
from . import atomic, atomic_group, attempt, completer, executor, metering, outcomes, timeouts
from .atomic_group import NOTHING, AtomicGroup
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

    def run(
        self, running: RunningJob, conns: ThreadConnections, group: AtomicGroup | None = None
    ) -> None:
        """On a job thread: check the connection, run, persist, free the slot.

        ``group``: the thread's group of atomic jobs (``atomic_group``). A job
        that may not join it settles it first (one that finds it full, old or
        broken then opens the next group: alone it would cost a commit of its own).
        A success that joined it stays among the worker's jobs until the group
        settles (``settle_group``), and anything else is written once the
        group is settled, in a transaction of its own.
        """
        try:
            grouped = group is not None and group.eligible(running)
            # A group with no room is settled, and the job opens the next one.
            roomless = group is not None and group.open and not (grouped and group.has_room())
        except Exception:  # a bug of ours: the job runs alone
            logger.exception(
                "job %s: could not tell whether it may join a group", running.claimed.id
            )
            grouped, roomless = False, group is not None and group.open
        if roomless and group is not None:
            self.settle_group(group, conns)
        if not self.register(running):
            return
        outcome: Outcome | None = None
        meter: metering.Meter | None = None
        handed_over = joined = False
        try:
            # A group's open transaction proves its connection (and a check
            # would close a connection found inside a transaction).
            meter = self.begin(running, conns, check=not (grouped and group and group.open))
            if meter is None:
                outcome = Outcome(kind="released")
                return
            in_group = group if grouped else None
            if tracing.AVAILABLE and tracing.active():  # a consumer span, under the enqueue's
                with tracing.consumer(running.claimed) as span:
                    outcome = self._attempt(running, in_group)
                    tracing.outcome(span, outcome.kind, outcome.exception)
            else:
                outcome = self._attempt(running, in_group)
            self.ran(running, meter)
            if running.grouped:
                joined = True
                return
            if group is not None and group.open:
                self.settle_group(group, conns)
            if running.persisted:  # an atomic success: committed with its body, or lost
                atomic.report(running, outcome)
                return
            handed_over = self.completer.hand_over(running, outcome, meter)
            if handed_over:
                meter = None  # the reporter drops it, once the wave wrote the usage record
            else:
                self.write(running, outcome)
        except Exception as e:
            if group is not None and group.open and not joined:
                self.settle_group(group, conns)
            outcome = self.unexpected(running, e)
        finally:
            if joined:
                self.left_in_group(running)
            else:
                self.end(running, outcome, meter, conns, written=not handed_over)

    def left_in_group(self, running: RunningJob) -> None:
        """A success waiting in its thread's group: its code is over, its slot free."""
        with self.slots.lock:
            self.slots.threads.pop(running.claimed.id, None)
        self.completer.wake()  # the control loop: a slot is free

    def settle_group(self, group: AtomicGroup, conns: ThreadConnections) -> None:
        """Commit (or roll back) the thread's group, then end each of its jobs:
        handed back unspent (fenced) if it did not commit."""
        members, won = group.settle()
        for member in members:
            try:
                self.end_member(member, won, conns)
            except Exception:  # a bug of ours: the next member is still ended
                logger.exception("job %s: could not end it", member.running.claimed.id)
        group.run_callbacks()  # user code: only once every member is ended

    def end_member(
        self, member: atomic_group.Member, won: bool, conns: ThreadConnections | None, why: str = ""
    ) -> None:
        """A group's member once the group settled (or was given up on): report, end."""
        running = member.running
        running.persisted, running.won = True, won
        why = why or "its group of atomic jobs rolled back"
        outcome = member.outcome if won else Outcome(kind="released", why=why)
        try:
            if won:
                atomic.report(running, member.outcome)
            else:
                outcomes.release(running.claimed, why=why)
        except Exception:  # the database unreachable: its lease expires, it runs again
            logger.exception("job %s: could not hand it back", running.claimed.id)
        self.end(running, outcome, member.meter, conns)

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
        if meter.wall is None:  # an atomic success stopped it before its commit's wait
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
        conns: ThreadConnections | None,
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
        if conns is not None:  # None: not on the job's own thread (a forsaken group)
            conns.end_job(self.db)
        with self.slots.lock:
            if written and self.slots.running.get(job_id) is running:
                del self.slots.running[job_id]
            self.slots.threads.pop(job_id, None)
            self.slots.lingering.pop(job_id, None)
        if written:
            self.completer.wake()  # the control loop: a slot is free

    def _attempt(self, running: RunningJob, group: AtomicGroup | None = None) -> Outcome:
        """Run the task once; the outcome, as its timeout or a hand-back changed it."""
        self.overseer.started(running)
        if group is not None:
            outcome = group.execute(running)
            if running.grouped:  # waits for the group's commit: its timeout is over
                self.overseer.returned(running)
                return outcome
        elif getattr(running.task, "atomic", False):
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
        #: Each thread's group of atomic jobs (``atomic_group``).
        self.groups: dict[threading.Thread, AtomicGroup] = {}
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(
            target=store.carrying_database(self._loop), name="dispatch-job", daemon=True
        )
        self.groups[thread] = AtomicGroup(self.runner.db, self.runner.slots)
        self.threads.append(thread)
        thread.start()

    def submit(self, running: RunningJob) -> None:
        self.inbox.put(running)

    def retire(self, thread: threading.Thread | None) -> None:
        """Give up on a thread stuck in task code; a fresh one takes its place.

        The successes waiting in its group would wait for its stuck body:
        they go back to the queue (their writes roll back with its
        transaction, whenever it ends), and run again.
        """
        if thread is not None and thread in self.threads:
            self.threads.remove(thread)
            self.retired.add(thread)
            self._spawn()
            group = self.groups.pop(thread, None)
            if group is not None:
                self._forsake(group)

    def forsake_groups(self, stuck_at: float | None = None) -> None:
        """At a hand-back: the successes waiting in groups go back too (fenced):
        a group still open at exit rolls back, and they would wait out their lease.
        With ``stuck_at`` (the control loop's every turn): only the groups
        whose members have waited too long by then (``AtomicGroup.stuck``)."""
        for group in list(self.groups.values()):
            if stuck_at is None or group.stuck(stuck_at):
                self._forsake(group)

    def _forsake(self, group: AtomicGroup) -> None:
        for member in group.forsake():
            member.running.abandoned = True
            self.runner.end_member(member, False, None, why=atomic_group.FORSAKEN)

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
        group = self.groups[me]
        try:
            while me not in self.retired:
                running = self._next(group, conns)
                if running is None:
                    return
                try:
                    self.runner.run(running, conns, group)
                except BaseException:  # never lose a job thread silently
                    logger.exception("job thread crashed; it carries on")
        finally:
            try:
                if group.open:
                    self.runner.settle_group(group, conns)
            except Exception:
                logger.exception("job thread: settling its group failed")
            finally:
                connections.close_all()

    def _next(self, group: AtomicGroup, conns: ThreadConnections) -> RunningJob | None:
        """The next job (None: stop). An open group commits first when no job
        comes within its ``patience``: none at all unless a backlog waits."""
        if group.open:
            job = group.next_from(self.inbox)
            if job is not NOTHING:
                return job
            try:
                self.runner.settle_group(group, conns)
            except Exception:  # never lose a job thread silently
                logger.exception("job thread: settling its group failed; it carries on")
        return self.inbox.get()
