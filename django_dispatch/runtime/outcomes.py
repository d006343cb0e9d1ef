"""The one-by-one writers of an attempt's end, each fenced by the job's lease.

Everything that is not a success written in a wave (``completer.BatchCompleter``)
is written here: a failure, a retry, a cancellation acknowledged, an
interruption, a hand-back (``hand_back``, ``release``), a timeout the control
loop records (``record_timeout``), and a success whose wave could not be
written (``persist``). ``completer`` re-exports them, where the worker's roles
call them.

A write that matches no row means this worker no longer holds the job (it
was cancelled, timed out, or reclaimed after missed heartbeats): the result
is discarded and logged, never forced in.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, InterfaceError, transaction

from .. import store
from ..compat import Task
from ..conf import usage_recorded
from ..exceptions import TaskTimeout
from ..store.usage import usage_record_many
from ..store.workflows import mapwave, preclaim
from . import metering, timeouts
from .connections import recover_after_error
from .executor import Outcome
from .reporter import report_released, report_written, signal_finished, signal_finished_and_close

logger = logging.getLogger("django_dispatch.worker")


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
    # A map child's success left to the job's wave is written before the job's.
    mapwave.flush(store.db_alias(), claimed.id, lease.epoch)
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
    """Undo the claim's attempt: the count and the worker it added.

    The step its wave claimed for it goes back to ``ready`` first, while the
    job is still leased here: once the job is back in the queue another
    worker may lease it, and its attempt, finding the step still running,
    would take it over, only for this undo to void that claim (the step
    then ready again under a job that ended as superseded: nothing runs it
    until the stale-step sweep). Fenced by the wave's claim id, the undo
    changes nothing if the job was no longer this worker's.
    """
    try:
        preclaim.release(db or store.db_alias(), claimed.id, claimed.lease.epoch)
    except DatabaseError:
        # The job goes back all the same: its next run takes the step over,
        # noting a lost attempt that never ran.
        logger.warning("job %s: its step's claim was not undone", claimed.id, exc_info=True)
    row = claimed.row
    return store.job_release_if_leased(
        claimed.lease, attempts=row["attempts"] - 1, worker_ids=row["worker_ids"][:-1], db=db
    )


def let_go(lease: store.Lease, partition_key: str | None, *, db: str | None = None) -> bool:
    """Let go of a job found cancelled (fenced; True if it was): frees its partition."""
    return store.job_ack_cancelled(lease, partition_key=partition_key, db=db)
