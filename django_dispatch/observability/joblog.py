"""The job log: the one hook the worker calls about a job: it started, it ran, it ended.

Each *outcome* a worker writes (or fails to write) is reported here once,
from the place that made the write, so that it is logged once and counted
once:

========================  =========  ==============================================
outcome (metric state)    level      when
========================  =========  ==============================================
``succeeded``             (none)     the success was written
``retried``               WARNING    an attempt failed; the job runs again later
``failed``                ERROR      the job failed for good (dead letter written)
``cancelled``             WARNING    cancelled while it ran: its result is dropped
``lost``                  WARNING    the lease was gone when the outcome was written
``interrupted``           WARNING    the database broke under the task: run again
``released``              WARNING    handed back without spending an attempt
``worker_lost``           WARNING    the leader found its worker dead: run again
========================  =========  ==============================================

A job failed as ``worker_lost`` for good is reported as ``failed`` with the
error class ``django_dispatch.exceptions.WorkerLost``.

Every record carries the job's fields as ``extra`` (see ``job_fields``), so
that a JSON formatter or Sentry's logging integration gets them as fields
rather than as text to parse: ``dispatch_job_id``, ``dispatch_task``,
``dispatch_queue``, ``dispatch_attempt``, ``dispatch_worker_id``,
``dispatch_outcome`` and, for an outcome with an exception,
``dispatch_error_class`` and ``dispatch_error``.

Cost: a success is one metrics check (a module constant when metrics are
off); nothing is formatted for it.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..conf.redaction import error_redactor
from ..core.failures import redacted, redacted_code
from ..store import WORKER_LOST_PATH
from . import metrics

if TYPE_CHECKING:
    from ..store import ClaimedJob

logger = logging.getLogger("django_dispatch.worker")

#: Outcomes that are not an error of the job, logged at WARNING.
_WARNING = {"retried", "cancelled", "lost", "interrupted", "released", "worker_lost"}


def error_class(exception: BaseException | None) -> str | None:
    """The exception's class path, as stored in ``Job.errors``."""
    if exception is None:
        return None
    cls = type(exception)
    return f"{cls.__module__}.{cls.__qualname__}"


def row_fields(row: Mapping[str, Any], worker_id: str | None) -> dict[str, Any]:
    """The ``extra`` of a record about one job, from its row."""
    return {
        "dispatch_job_id": row["id"],
        "dispatch_task": row["task_path"],
        "dispatch_queue": row["queue_name"],
        "dispatch_attempt": row["attempts"],
        "dispatch_worker_id": worker_id,
    }


def job_fields(claimed: ClaimedJob, **more: Any) -> dict[str, Any]:
    """The ``extra`` of a record about a job this worker claimed."""
    return {**row_fields(claimed.row, claimed.lease.worker_id), **more}


def worker_fields(worker_id: str, **more: Any) -> dict[str, Any]:
    """The ``extra`` of a record about a worker (start, stop, signals)."""
    return {"dispatch_worker_id": worker_id, **more}


def worker_started(worker_id: str, queues: Sequence[str], concurrency: int) -> None:
    """The worker's start line (INFO), and its slots for the metrics."""
    logger.info(
        "worker %s started: queues=%s concurrency=%s",
        worker_id,
        list(queues) or "all",
        concurrency,
        extra=worker_fields(
            worker_id,
            dispatch_queues=list(queues),
            dispatch_concurrency=concurrency,
            dispatch_pid=os.getpid(),
        ),
    )
    if metrics.WORKER is not None:
        metrics.WORKER.heartbeat(busy=0, slots=concurrency)


def worker_stopped(worker_id: str, claimed: int, *, recycling: bool) -> None:
    """The worker's stop line (INFO)."""
    logger.info(
        "worker %s %s (%s jobs claimed)",
        worker_id,
        "ends its process to recycle it" if recycling else "stopped",
        claimed,
        extra=worker_fields(worker_id, dispatch_claimed=claimed, dispatch_pid=os.getpid()),
    )


def started(claimed: ClaimedJob) -> None:
    """On the job thread, before the task runs: count it and its wait in the queue."""
    if metrics.WORKER is not None:
        metrics.WORKER.started(claimed)


def ran(claimed: ClaimedJob, seconds: float) -> None:
    """On the job thread, once the task returned or raised (any outcome)."""
    if metrics.WORKER is not None:
        metrics.WORKER.ran(claimed, seconds)


def finished(
    claimed: ClaimedJob,
    outcome: str,
    *,
    exception: BaseException | None = None,
    retry_in: float | None = None,
    detail: str = "",
) -> None:
    """Count and log one outcome of an attempt (see the module docstring).

    ``detail`` says more about why (a lost lease's kind of result, how a
    job was handed back).
    """
    row = claimed.row
    if metrics.WORKER is not None:
        metrics.WORKER.finished(row["task_path"], row["queue_name"], outcome)
    if outcome == "succeeded":
        return
    _log(row, claimed.lease.worker_id, outcome, exception, retry_in, detail)


def worker_lost(row: Mapping[str, Any], *, failed: bool, max_worker_lost: int, by: str) -> None:
    """The leader found a job's worker dead (its lease expired): run again, or failed.

    ``row`` holds the job's ``id``, ``task_path``, ``queue_name``,
    ``attempts`` and ``worker_id`` (the lost worker's); ``by`` is the
    leader's worker id.
    """
    outcome = "failed" if failed else "worker_lost"
    if metrics.WORKER is not None:
        metrics.WORKER.finished(row["task_path"], row["queue_name"], outcome)
    fields = row_fields(row, by)
    fields.update(
        dispatch_outcome=outcome,
        dispatch_error_class=WORKER_LOST_PATH,
        dispatch_error=f"worker {row['worker_id']} stopped renewing its lease",
        dispatch_lost_worker_id=row["worker_id"],
    )
    if failed:
        logger.error(
            "job %s (%s, queue %s) failed for good: it lost its worker %s times "
            "(last: %s; DISPATCH['MAX_WORKER_LOST'] = %s)",
            row["id"],
            row["task_path"],
            row["queue_name"],
            max_worker_lost,
            row["worker_id"],
            max_worker_lost,
            extra=fields,
        )
    else:
        logger.warning(
            "job %s (%s, queue %s) attempt %s: its worker %s was lost (lease expired); "
            "back in the queue",
            row["id"],
            row["task_path"],
            row["queue_name"],
            row["attempts"],
            row["worker_id"],
            extra=fields,
        )


def _log(
    row: Mapping[str, Any],
    worker_id: str,
    outcome: str,
    exception: BaseException | None,
    retry_in: float | None,
    detail: str,
) -> None:
    cls = error_class(exception)
    fields = row_fields(row, worker_id)
    fields["dispatch_outcome"] = outcome
    redactor = error_redactor()
    text = redacted(str(exception), redactor) if exception is not None else ""
    if exception is not None:
        fields["dispatch_error_class"] = cls
        fields["dispatch_error_code"] = redacted_code(exception, redactor)
        fields["dispatch_error"] = text
    what = f"job {row['id']} ({row['task_path']}, queue {row['queue_name']})"
    attempt = f"attempt {row['attempts']}/{row['max_attempts']}"
    error = f"{cls}: {text}" if exception is not None else ""
    if outcome == "failed":
        _log_failed(what, attempt, error, exception, redactor, fields)
        return
    if outcome == "retried":
        retry = f"retrying in {retry_in:.3g} s" if retry_in is not None else "retrying"
        message = f"{attempt} failed: {error}; {retry}"
    elif outcome == "cancelled":
        message = f"{attempt} stopped: cancelled while it ran; its result is discarded"
    elif outcome == "lost":
        message = (
            f"{attempt}: lease {row.get('lease_epoch')} lost before its outcome was written "
            f"(cancelled, timed out or reclaimed meanwhile); {detail or 'its'} result discarded"
        )
    elif outcome == "interrupted":
        back = f" in {retry_in:g} s" if retry_in is not None else ""
        message = (
            f"{attempt}: its database connection broke under the task code ({error}); "
            f"back in the queue{back} without spending an attempt"
        )
    elif outcome == "released":
        message = (
            f"{attempt}: {detail or 'handed back'}; back in the queue without spending an attempt"
        )
    else:  # pragma: no cover - every outcome is listed above
        message = f"{attempt}: {outcome} {error}"
    level = logging.WARNING if outcome in _WARNING else logging.ERROR
    logger.log(level, "%s %s", what, message, extra=fields)


def _log_failed(
    what: str,
    attempt: str,
    error: str,
    exception: BaseException | None,
    redactor: Any,
    fields: dict[str, Any],
) -> None:
    """A failure for good, with its traceback: redacted text when a redactor is set
    (the logging module would format the raw one from ``exc_info``)."""
    exc_info = None
    if exception is not None and exception.__traceback__ is not None:
        if redactor is None:
            exc_info = (type(exception), exception, exception.__traceback__)
        else:
            error += "\n" + redacted("".join(traceback.format_exception(exception)), redactor)
    logger.error(
        "%s failed for good on %s: %s", what, attempt, error, exc_info=exc_info, extra=fields
    )
