"""Persist jobs' outcomes: fenced writes, then the ``task_finished`` signal.

Successes go in waves (``BatchCompleter``): one fenced UPDATE per wave,
inside the transaction in which the control loop claims the slots they free.
Every other outcome, and a success whose wave could not be written, is
written one by one (``persist``).

A write that matches no row means this worker no longer holds the job (it
was cancelled, timed out, or reclaimed after missed heartbeats): the result
is discarded and logged, never forced in.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from django.db import DatabaseError, InterfaceError, connections, transaction

from .. import store
from ..compat import Task, task_finished
from ..exceptions import TaskTimeout
from ..observability import events
from ..results import send_robust, signal_sender
from ..store.usage import usage_record_many
from . import metering, timeouts
from .connections import recover_after_error
from .executor import Outcome, RunningJob

logger = logging.getLogger("django_dispatch.worker")

#: Most successes written by one batched UPDATE.
COMPLETION_BATCH = 200
#: Longest wait for the rest of a wave of finishing jobs (see ``coalesce``).
COALESCE_SECONDS = 0.002
#: Most successes waiting for the reporter (``Reporter.behind``); beyond it a
#: job thread reports its own, as before the hand-over: slow ``task_finished``
#: receivers then slow the jobs down instead of growing this backlog.
REPORT_BACKLOG = 256


class BatchCompleter:
    """Successes written in waves, in the transaction that claims the slots they free.

    A job hands its success over (``offer``) and does not wait: a job thread
    goes on to its next job, a job on the event loop awaits the wave without
    a thread. The control loop takes a wave (``take``) and writes it with one
    fenced UPDATE inside the transaction in which it also claims (``write``):
    one commit, one WAL flush, per wave of jobs. After the commit it records
    whether each write won (``settle``) or that the transaction failed
    (``abort``) and calls the job's ``on_persisted``: the ``Reporter`` for a
    thread's job, the event loop for an async one. ``task_finished`` is sent
    there, never on the control loop: its receivers are user code.
    """

    def __init__(self, wakeup: threading.Event, wait_seconds: float) -> None:
        self.wakeup = wakeup
        self.wait_seconds = wait_seconds  # about a lease: then write it yourself
        self.waiting: queue.SimpleQueue[RunningJob] = queue.SimpleQueue()

    def offer(self, running: RunningJob, outcome: Outcome) -> bool:
        """Queue a success for the next wave (no waiting); False if not batchable."""
        if outcome.kind != "succeeded":
            return False
        running.finished = outcome
        self.waiting.put(running)
        self.wakeup.set()
        return True

    @staticmethod
    def after_wave(running: RunningJob, outcome: Outcome) -> bool:
        """Once the wave is written: report it and send ``task_finished`` (user code).

        False when the wave failed: the caller writes the outcome itself.
        """
        if running.won is None:
            return False
        if running.won:
            events.finished(running.claimed, "succeeded")
            signal_finished(outcome)
        else:
            events.finished(running.claimed, "lost", detail="its succeeded")
            # If it was cancelled, let go of it (which frees its partition).
            store.job_ack_cancelled(
                running.claimed.lease, partition_key=running.claimed.row["partition_key"]
            )
        return True

    def take(self) -> list[RunningJob]:
        """The successes waiting now, at most ``COMPLETION_BATCH``."""
        batch: list[RunningJob] = []
        while len(batch) < COMPLETION_BATCH:
            try:
                batch.append(self.waiting.get_nowait())
            except queue.Empty:
                break
        return batch

    @staticmethod
    def write(batch: list[RunningJob], db: str) -> set[int]:
        """Inside the caller's transaction: the ids whose fenced write won.

        The winners' usage records go with it: every job's is handed over,
        the store writes only those whose fenced write won (on PostgreSQL in
        the same statement: one round trip per wave).
        """
        if not batch:
            return set()
        results = [(r.claimed.lease, r.finished.return_value) for r in batch if r.finished]
        usage = {r.claimed.id: metering.entry(r.claimed, "succeeded") for r in batch if r.finished}
        return set(store.jobs_finish_many_if_leased(results, db=db, usage=usage))

    @staticmethod
    def settle(batch: list[RunningJob], won: set[int]) -> None:
        """After the commit: wake each thread with its result."""
        for running in batch:
            running.won = running.claimed.id in won
            _persisted(running)

    @staticmethod
    def abort(batch: list[RunningJob]) -> None:
        """The wave's transaction failed: each thread writes its own outcome."""
        for running in batch:
            running.won = None
            _persisted(running)

    def coalesce(self, running: int) -> None:
        """Let a wave of finishing jobs gather before writing it.

        Short jobs finish within microseconds of each other; waiting up to
        ``COALESCE_SECONDS`` for the rest of the wave (until as many are
        waiting as ``running`` jobs) turns many one-row completions, each a
        transaction and a claim, into one.
        """
        if self.waiting.empty():
            return
        deadline = time.monotonic() + COALESCE_SECONDS
        while self.waiting.qsize() < running and time.monotonic() < deadline:
            time.sleep(COALESCE_SECONDS / 8)


class Reporter:
    """After a wave: report the successes whose job threads went on to other jobs.

    A job thread hands its success to the wave (``BatchCompleter.offer``) and
    takes its next job at once instead of waiting for the wave's commit: the
    wave then carries every success that finished while the last one was
    written, and threads do not idle for a round trip per job. What the thread
    would have done after the commit is done here, on a thread of its own,
    never on the control loop: ``task_finished`` (its receivers are user
    code), the log line, letting go of a job found cancelled, and, when the
    wave failed, writing the outcome one by one (``persist``). Then the
    attempt's meter is dropped: the wave wrote its usage record from it.
    """

    def __init__(self, give_up_after: float) -> None:
        self.give_up_after = give_up_after
        self.inbox: queue.SimpleQueue[RunningJob | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="dispatch-finished", daemon=True)
        self.thread.start()

    def put(self, running: RunningJob) -> None:
        """From the control loop (``settle``, ``abort``): the wave is written or failed."""
        self.inbox.put(running)

    def behind(self) -> bool:
        """Whether ``REPORT_BACKLOG`` successes already wait to be reported.

        One thread runs every handed-over success's ``task_finished``
        receivers (user code): were they slower than the jobs, its queue
        would grow without bound, and the reports lag ever further. A job
        thread asks before handing a success over and, if the reporter is
        behind, writes and reports it itself (``JobRunner.hand_over``): the
        receivers then run on as many threads as jobs, at the jobs' pace.
        """
        return self.inbox.qsize() >= REPORT_BACKLOG

    def stop(self, timeout: float = 5.0) -> None:
        """Report what is queued, then end (after the worker's last wave)."""
        self.inbox.put(None)
        self.thread.join(timeout)

    def _loop(self) -> None:
        try:
            while (running := self.inbox.get()) is not None:
                try:
                    self._report(running)
                except Exception:
                    logger.exception("job %s: could not report its outcome", running.claimed.id)
        finally:
            connections.close_all()

    def _report(self, running: RunningJob) -> None:
        outcome = running.finished
        assert outcome is not None
        try:
            if not BatchCompleter.after_wave(running, outcome):  # the wave failed
                persist(
                    running.claimed,
                    outcome,
                    give_up_after=self.give_up_after,
                    report=not running.abandoned,
                )
        finally:
            metering.forget(running.claimed.id, running.meter)


def _persisted(running: RunningJob) -> None:
    running.persisted = True
    if running.on_persisted is not None:
        running.on_persisted()


def usage_outcome(outcome: Outcome) -> str | None:
    """The ``JobUsage.outcome`` of an attempt ending so; None: no attempt was spent."""
    if outcome.kind in ("retry", "failed"):
        return "timed_out" if isinstance(outcome.exception, TaskTimeout) else "failed"
    return {"succeeded": "succeeded", "interrupted": "interrupted", "discarded": "cancelled"}.get(
        outcome.kind
    )


def _write_with_usage(claimed: store.ClaimedJob, outcome: Outcome) -> bool:
    """``_write``, and if it won, the attempt's usage record in the same transaction."""
    kind = usage_outcome(outcome)
    if kind is None:  # released: no attempt spent, no record
        return _write(claimed, outcome)
    entry = metering.entry(claimed, kind)
    db = store.db_alias()
    with transaction.atomic(using=db):
        won = _write(claimed, outcome)
        if won:
            usage_record_many([entry], db=db)
    return won


def _write(claimed: store.ClaimedJob, outcome: Outcome) -> bool:
    lease, key = claimed.lease, claimed.row["partition_key"]
    if outcome.kind == "succeeded":
        return store.job_finish_if_leased(lease, outcome.return_value, partition_key=key)
    if outcome.kind == "discarded":  # True: it was cancelled (else lost)
        return store.job_ack_cancelled(lease, partition_key=key)
    if outcome.kind == "interrupted":
        assert outcome.retry_in is not None
        return store.job_interrupt_if_leased(lease, outcome.errors, retry_in=outcome.retry_in)
    if outcome.kind == "released":
        row = claimed.row
        return store.job_release_if_leased(
            lease, attempts=row["attempts"] - 1, worker_ids=row["worker_ids"][:-1]
        )
    return store.job_fail_if_leased(lease, outcome.errors, outcome.retry_in, partition_key=key)


#: The metric state and log outcome of each kind of write (see ``observability.events``).
_REPORTED = {
    "succeeded": "succeeded",
    "retry": "retried",
    "failed": "failed",
    "interrupted": "interrupted",
    "released": "released",
}


def persist(
    claimed: store.ClaimedJob,
    outcome: Outcome,
    *,
    give_up_after: float,
    signal: bool = True,
    report: bool = True,
) -> bool:
    """Write the outcome, retrying transient database errors.

    Gives up after ``give_up_after`` seconds (about a lease): by then the job
    is reclaimed and will run again, which is the at-least-once fallback.
    A lost job that was cancelled is let go (``job_ack_cancelled``), which
    frees its partition.

    The outcome is logged and counted here (``observability.events``), once,
    unless ``report`` is False: a job whose outcome someone else already
    recorded (handed back, or its timeout recorded by the control loop).
    """
    lease = claimed.lease
    deadline = time.monotonic() + give_up_after
    pause = 0.05
    while True:
        try:
            won = _write_with_usage(claimed, outcome)
            if not won and outcome.kind != "discarded":
                store.job_ack_cancelled(lease, partition_key=claimed.row["partition_key"])
            break
        except (DatabaseError, InterfaceError):
            if time.monotonic() >= deadline:
                logger.exception("job %s: could not record its outcome; giving up", lease.job_id)
                return False
            logger.warning(
                "job %s: recording outcome failed; retrying", lease.job_id, exc_info=True
            )
            recover_after_error()
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
    if outcome.kind == "discarded":
        if report:  # won: the ack found it cancelled
            events.finished(claimed, "cancelled" if won else "lost", detail="its")
        return False
    if not won:
        if report:
            events.finished(claimed, "lost", detail=f"its {outcome.kind}")
        return False
    if report:
        events.finished(
            claimed,
            _REPORTED[outcome.kind],
            exception=outcome.exception,
            retry_in=outcome.retry_in,
            detail="the database could not be reached before its task code started"
            if outcome.kind == "released"
            else "",
        )
    if outcome.kind in ("interrupted", "released"):
        return True
    if signal:
        signal_finished(outcome)
    return True


def record_timeout(
    claimed: store.ClaimedJob,
    timeout: float,
    *,
    how: str,
    give_up_after: float,
    task: Task | None,
) -> bool:
    """From the control loop: record an attempt over its timeout (retry or fail, fenced).

    ``task`` is the job's resolved Task (``RunningJob.task``). ``task_finished``
    goes out on a thread of its own: its receivers are user code, never run
    on the control loop.
    """
    outcome = timeouts.timeout_outcome(claimed, timeout, how=how, task=task)
    won = persist(claimed, outcome, give_up_after=give_up_after, signal=False)  # logs it
    if won:
        threading.Thread(target=signal_finished_and_close, args=(outcome,), daemon=True).start()
    return won


def hand_back(
    claimed: store.ClaimedJob,
    *,
    timed_out: float | None,
    give_up_after: float,
    task: Task | None,
) -> bool:
    """At the end of a shutdown: back to the queue without spending an attempt (fenced).

    A job cancelled meanwhile is let go of instead, which frees its partition.
    A job already over its ``timed_out`` seconds has its timeout recorded:
    that attempt counts (``task``: as in ``record_timeout``).
    """
    if timed_out is not None:
        return record_timeout(
            claimed,
            timed_out,
            how="its worker shut down meanwhile",
            give_up_after=give_up_after,
            task=task,
        )
    row = claimed.row
    released = store.job_release_if_leased(
        claimed.lease, attempts=row["attempts"] - 1, worker_ids=row["worker_ids"][:-1]
    )
    cancelled = not released and store.job_ack_cancelled(
        claimed.lease, partition_key=row["partition_key"]
    )
    report_released(claimed, released, cancelled, why="handed back at shutdown")
    return released


def report_released(
    claimed: store.ClaimedJob, released: bool, cancelled: bool, *, why: str
) -> None:
    """Log and count a hand-back: released, or found cancelled or lost meanwhile."""
    if released:
        events.finished(claimed, "released", detail=why)
    else:
        events.finished(claimed, "cancelled" if cancelled else "lost", detail="its unfinished")


def signal_finished_and_close(outcome: Outcome) -> None:
    """``signal_finished`` on a thread of its own, closing its connections after."""
    try:
        signal_finished(outcome)
    finally:
        connections.close_all()


def signal_finished(outcome: Outcome) -> None:
    result = outcome.task_result
    if result is None:
        return
    try:
        sender = signal_sender(result.task)
    except Exception:  # its backend alias is gone from TASKS: the outcome is written anyway
        logger.exception("job %s: task_finished not sent (no backend to send it)", result.id)
        return
    if outcome.exception is None:
        send_robust(task_finished, sender, result)
        return
    # Sent from inside an except block, so that Django's own log receiver
    # (which reads sys.exc_info()) logs the task's traceback.
    try:
        raise outcome.exception
    except BaseException:
        send_robust(task_finished, sender, result)
