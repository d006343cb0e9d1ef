"""Persist a job's outcome: one fenced write, then the ``task_finished`` signal.

A write that matches no row means this worker no longer holds the job (it
was cancelled, timed out, or reclaimed after missed heartbeats): the result
is discarded and logged, never forced in.
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError, InterfaceError, connections
from django.tasks.signals import task_finished

from .. import store
from ..backend import DispatchBackend, send_robust
from .connections import recover_after_error
from .executor import Outcome

logger = logging.getLogger("django_dispatch.worker")


def _write(claimed: store.ClaimedJob, outcome: Outcome) -> bool:
    lease, key = claimed.lease, claimed.row["partition_key"]
    if outcome.kind == "succeeded":
        return store.job_finish_if_leased(lease, outcome.return_value, partition_key=key)
    if outcome.kind == "discarded":
        store.job_ack_cancelled(lease, partition_key=key)
        return False
    if outcome.kind == "interrupted":
        assert outcome.retry_in is not None
        return store.job_interrupt_if_leased(lease, outcome.errors, retry_in=outcome.retry_in)
    if outcome.kind == "released":
        row = claimed.row
        return store.job_release_if_leased(
            lease, attempts=row["attempts"] - 1, worker_ids=row["worker_ids"][:-1]
        )
    return store.job_fail_if_leased(lease, outcome.errors, outcome.retry_in, partition_key=key)


def persist(
    claimed: store.ClaimedJob, outcome: Outcome, *, give_up_after: float, signal: bool = True
) -> bool:
    """Write the outcome, retrying transient database errors.

    Gives up after ``give_up_after`` seconds (about a lease): by then the job
    is reclaimed and will run again, which is the at-least-once fallback.
    A lost job that was cancelled is let go (``job_ack_cancelled``), which
    frees its partition.
    """
    lease = claimed.lease
    deadline = time.monotonic() + give_up_after
    pause = 0.05
    while True:
        try:
            won = _write(claimed, outcome)
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
        logger.info("job %s: stopped (cancelled or lost); result discarded", lease.job_id)
        return False
    if not won:
        log_lost(lease, outcome)
        return False
    if outcome.kind in ("interrupted", "released"):
        logger.warning(
            "job %s: %s; back in the queue without spending an attempt",
            lease.job_id,
            "its database connection broke under the task code (run again in "
            f"{outcome.retry_in:g} s)"
            if outcome.kind == "interrupted"
            else "the database could not be reached before its task code started",
        )
        return True
    if signal:
        signal_finished(outcome)
    return True


def signal_finished_and_close(outcome: Outcome) -> None:
    """``signal_finished`` on a thread of its own, closing its connections after."""
    try:
        signal_finished(outcome)
    finally:
        connections.close_all()


def log_lost(lease: store.Lease, outcome: Outcome) -> None:
    logger.warning(
        "job %s: lease %s lost before completion (cancelled, timed out or reclaimed); "
        "%s result discarded",
        lease.job_id,
        lease.epoch,
        outcome.kind,
    )


def signal_finished(outcome: Outcome) -> None:
    result = outcome.task_result
    if result is None:
        return
    sender = DispatchBackend
    if outcome.exception is None:
        send_robust(task_finished, sender, result)
        return
    # Sent from inside an except block, so that Django's own log receiver
    # (which reads sys.exc_info()) logs the task's traceback.
    try:
        raise outcome.exception
    except BaseException:
        send_robust(task_finished, sender, result)
