"""Persist jobs' outcomes: the writer of an attempt's end, always fenced.

The one exception is an atomic task's success, which must commit with the
task's own writes: ``atomic`` writes it in the task's transaction.

Successes go in waves (``BatchCompleter``): a job hands its success over
(``hand_over``) and goes on; the completer writes the wave with one fenced
UPDATE, in the same transaction as the claim that refills the slots the
wave frees (``write_wave``), then wakes each job's reporter (``settle``, or
``abort`` when the transaction failed). Every other outcome, and a success
whose wave could not be written, is written one by one (``persist``); so
are the hand-backs of a stopping worker (``hand_back``) and the timeouts
the control loop records (``record_timeout``).

A write that matches no row means this worker no longer holds the job (it
was cancelled, timed out, or reclaimed after missed heartbeats): the result
is discarded and logged, never forced in.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from functools import partial

from django.db import DatabaseError, InterfaceError, transaction

from .. import store
from ..compat import Task
from ..conf import usage_recorded
from ..exceptions import TaskTimeout
from ..observability import joblog
from ..store.usage import usage_record_many
from . import metering, timeouts
from .connections import recover_after_error
from .executor import Outcome
from .reporter import (
    Reporter,
    report_released,
    report_written,
    settle_quietly,
    signal_finished,
    signal_finished_and_close,
)
from .running import RunningJob
from .slots import Slots

logger = logging.getLogger("django_dispatch.worker")

#: Most successes written by one batched UPDATE.
COMPLETION_BATCH = 200
#: Longest wait for the rest of a wave of finishing jobs (see ``coalesce``).
COALESCE_SECONDS = 0.002


class BatchCompleter:
    """Successes written in waves, in the transaction that claims the slots they free.

    A job hands its success over (``hand_over``, ``offer``) and does not
    wait: a job thread goes on to its next job, a job on the event loop
    awaits the wave without a thread. The control loop's producer asks for
    a wave (``take``) and has it written (``write_wave``): one fenced UPDATE
    and the claim in one transaction, one commit, one WAL flush per wave of
    jobs. After the commit each job learns whether its write won
    (``settle``) or that the transaction failed (``abort``) through its
    ``on_persisted``: the ``Reporter`` for a thread's job, the event loop
    for an async one. ``task_finished`` is sent there, never on the control
    loop: its receivers are user code.
    """

    def __init__(
        self,
        wakeup: threading.Event,
        wait_seconds: float,
        *,
        slots: Slots | None = None,
        db: str | None = None,
    ) -> None:
        self.wakeup = wakeup
        self.wait_seconds = wait_seconds  # about a lease: then write it yourself
        self.waiting: queue.SimpleQueue[RunningJob] = queue.SimpleQueue()
        self.slots = slots
        self.db = db or store.db_alias()
        #: Reports the successes written in waves (``start`` to ``stop``).
        self.reporter: Reporter | None = None

    def start(self) -> None:
        """Start the reporter thread (``Worker.run``): waves may be written from now on."""
        self.reporter = Reporter(self.report)

    def stop(self) -> None:
        """After the last wave: report what is queued, then end the reporter."""
        if self.reporter is not None:
            self.reporter.stop()

    def hand_over(self, running: RunningJob, outcome: Outcome, meter: metering.Meter) -> bool:
        """On a job thread: a success joins the next wave and the thread goes on.

        False (the caller writes and reports it itself, ``persist``) for
        anything but a success, without a reporter, and while the reporter is
        behind (``Reporter.behind``).
        """
        reporter = self.reporter
        if outcome.kind != "succeeded" or reporter is None or reporter.behind():
            return False
        running.meter = meter
        if outcome.task_result is None:  # no task_finished to send (attempt.prepare)
            running.on_persisted = partial(settle_quietly, running, reporter)
        else:
            running.on_persisted = partial(reporter.put, running)
        return self.offer(running, outcome)

    def offer(self, running: RunningJob, outcome: Outcome) -> bool:
        """Queue a success for the next wave (no waiting); False if not batchable."""
        if outcome.kind != "succeeded":
            return False
        running.finished = outcome
        self.waiting.put(running)
        self.wakeup.set()
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

    def write_wave(
        self, batch: list[RunningJob], claim: Callable[[int], list[store.ClaimedJob]], limit: int
    ) -> list[store.ClaimedJob]:
        """Write ``batch`` and ``claim`` up to ``limit`` jobs, in one transaction.

        The claim sees the slots the wave frees, and both commit together:
        a crash between them cannot leave a job written but its slot still
        counted, nor a claim made for slots that were never freed. If the
        transaction fails, each job of the wave writes its own (``abort``).
        Returns the claimed jobs, for the producer to start.
        """
        try:
            with transaction.atomic(using=self.db):
                won = self.write(batch, self.db)
                claimed = claim(limit) if limit > 0 else []
        except BaseException:
            self.abort(batch)
            raise
        if self.slots is not None:
            self.slots.drop_written(batch)
        self.settle(batch, won)
        return claimed

    @staticmethod
    def write(batch: list[RunningJob], db: str) -> set[int]:
        """Inside the caller's transaction: the ids whose fenced write won.

        The winners' usage records go with it: every job's is handed over,
        the store writes only those whose fenced write won (on PostgreSQL in
        the same statement: one round trip per wave).
        """
        if not batch:
            return set()
        done = [(r, r.finished) for r in batch if r.finished]
        results = [(r.claimed.lease, finished.return_value) for r, finished in done]
        usage = None
        if usage_recorded("succeeded"):
            usage = {r.claimed.id: metering.entry(r.claimed, "succeeded") for r, _ in done}
        return set(store.jobs_finish_many_if_leased(results, db=db, usage=usage))

    @staticmethod
    def settle(batch: list[RunningJob], won: set[int]) -> None:
        """After the commit: wake each job with its result."""
        for running in batch:
            running.won = running.claimed.id in won
            _persisted(running)

    @staticmethod
    def abort(batch: list[RunningJob]) -> None:
        """The wave's transaction failed: each job writes its own outcome."""
        for running in batch:
            running.won = None
            _persisted(running)

    @staticmethod
    def after_wave(running: RunningJob, outcome: Outcome) -> bool:
        """Once the wave is written: report it and send ``task_finished`` (user code).

        False when the wave failed: the caller writes the outcome itself.
        """
        if running.won is None:
            return False
        if running.won:
            joblog.finished(running.claimed, "succeeded")
            signal_finished(outcome)
        else:
            joblog.finished(running.claimed, "lost", detail="its succeeded")
            # If it was cancelled, let go of it (which frees its partition).
            store.job_ack_cancelled(
                running.claimed.lease, partition_key=running.claimed.row["partition_key"]
            )
        return True

    def report(self, running: RunningJob) -> None:
        """On the reporter's thread: ``after_wave``, or ``persist`` if the wave failed;
        then drop the attempt's meter (the wave wrote its usage record from it)."""
        outcome = running.finished
        assert outcome is not None
        try:
            if not self.after_wave(running, outcome):  # the wave failed
                persist(
                    running.claimed,
                    outcome,
                    give_up_after=self.wait_seconds,
                    report=not running.abandoned,
                )
        finally:
            metering.forget(running.claimed.id, running.meter)

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
    if kind is None or not usage_recorded(kind):  # released: no attempt spent, no record
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
        return _release(claimed)
    return store.job_fail_if_leased(lease, outcome.errors, outcome.retry_in, partition_key=key)


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

    The outcome is logged and counted here (``observability.joblog``), once,
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
    if report:
        report_written(claimed, outcome, won)
    if outcome.kind == "discarded" or not won:
        return False
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
    return release(claimed, why="handed back at shutdown")


def release(claimed: store.ClaimedJob, *, why: str, db: str | None = None) -> bool:
    """Hand a job back unstarted, no attempt spent (fenced), and report it.

    A job cancelled meanwhile is let go of instead, which frees its partition.
    """
    released = _release(claimed, db=db)
    cancelled = not released and let_go(claimed.lease, claimed.row["partition_key"], db=db)
    report_released(claimed, released, cancelled, why=why)
    return released


def _release(claimed: store.ClaimedJob, *, db: str | None = None) -> bool:
    """Undo the claim's attempt: the count and the worker it added."""
    row = claimed.row
    return store.job_release_if_leased(
        claimed.lease, attempts=row["attempts"] - 1, worker_ids=row["worker_ids"][:-1], db=db
    )


def let_go(lease: store.Lease, partition_key: str | None, *, db: str | None = None) -> bool:
    """Let go of a job found cancelled (fenced; True if it was): frees its partition."""
    return store.job_ack_cancelled(lease, partition_key=partition_key, db=db)
