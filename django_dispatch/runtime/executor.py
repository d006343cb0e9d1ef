"""Classify what one attempt came to. No I/O: no database, no settings, no backend.

The outcome is one of: succeeded (with a JSON return value), retry (with a
delay), failed (for good), discarded (the job was cancelled or lost while
it ran, so whatever it produced must not be written), interrupted (the
database connection broke under the task code: run again, counted as a lost
worker, see ``store.interruptions``) or released (task code never started:
hand the job back as if it had not been claimed).

Everything this module decides from comes in as arguments: the claimed row,
what the task function returned or raised, and a ``RetryPolicy`` the caller
resolved (``attempt.retry_policy``) only when an attempt failed, so a
success costs no lookup. Running the task is ``attempt``'s job, persisting
the outcome the completer's.

Where the line is for database faults: before the task function is called
(connection checks, task resolution), a fault costs the job nothing, it is
*released*. Once task code has run it may have had side effects, so a second
run is an at-least-once re-execution; it is still the default
(``RetryPolicy.retry_on_connection_loss``), because the alternative loses
the job to a fault that was not its own, and tasks must be idempotent anyway
(any worker crash re-runs them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from ..compat import Task, TaskError, TaskResult, TaskResultStatus
from ..core.retry import Backoff, exponential_backoff, next_delay
from ..core.states import JobState
from ..store import ClaimedJob
from ..tasks.results import error_of, result_from_values

logger = logging.getLogger("django_dispatch.worker")

Kind = Literal["succeeded", "retry", "failed", "discarded", "interrupted", "released"]


@dataclass
class Outcome:
    kind: Kind
    return_value: Any = None
    exception: BaseException | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)  # whole history
    retry_in: float | None = None
    task_result: TaskResult | None = None  # as it stands after this attempt
    #: Why a job goes back unspent (``released``), for its log line.
    why: str = "the database could not be reached before its task code started"


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed attempt of one job may be retried, resolved by the caller."""

    #: Attempts the job may spend (its row's ``max_attempts``).
    max_attempts: int
    #: Seconds until the next attempt, None: no retry (the task's backoff).
    backoff: Backoff = exponential_backoff
    #: A lost database connection runs the attempt again without spending it.
    retry_on_connection_loss: bool = True
    #: Attempts lost to dead workers or connections after which the job fails.
    max_worker_lost: int = 3


def _with_status(result: TaskResult, status: TaskResultStatus, **changes: Any) -> TaskResult:
    for name, value in {"status": status, **changes}.items():
        object.__setattr__(result, name, value)
    return result


def running_result(claimed: ClaimedJob, task: Task) -> TaskResult:
    values = {
        **claimed.row,
        "state": JobState.RUNNING,
        "finished_at": None,
        "return_value": None,
    }
    return result_from_values(values, task=task)


def classify_failure(
    claimed: ClaimedJob,
    exception: BaseException,
    *,
    task: Task | None,
    policy: RetryPolicy | None,
) -> Outcome:
    """Retry or failure for an attempt that raised ``exception``.

    ``policy`` None: the attempt is not retried whatever its budget (a task
    that cannot run, a value that cannot be stored, a bug of the worker's).
    """
    row = claimed.row
    errors = [*row["errors"], error_of(exception)]
    result = running_result(claimed, task) if task is not None else None
    delay = None
    if policy is not None and task is not None and result is not None:
        object.__setattr__(
            result,
            "errors",
            [
                TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
                for e in errors
            ],
        )
        try:
            delay = next_delay(
                # Attempts lost to dead workers do not count against the budget.
                attempts=row["attempts"] - row["worker_lost_count"],
                max_attempts=policy.max_attempts,
                backoff=policy.backoff,
                exception=exception,
                task_result=result,
            )
        except Exception:
            logger.exception("job %s: backoff function failed; using the default", claimed.id)
            delay = exponential_backoff(exception, result)
    if result is not None:
        status = TaskResultStatus.READY if delay is not None else TaskResultStatus.FAILED
        _with_status(result, status)
    return Outcome(
        kind="retry" if delay is not None else "failed",
        exception=exception,
        errors=errors,
        retry_in=delay,
        task_result=result,
    )


def classify_interruption(
    claimed: ClaimedJob, exception: BaseException, *, task: Task, policy: RetryPolicy
) -> Outcome:
    """Run again without spending an attempt, unless the lost-worker budget is spent."""
    row = claimed.row
    lost = row["worker_lost_count"] + 1
    if not policy.retry_on_connection_loss or lost >= policy.max_worker_lost:
        # Off: an ordinary exception under the task's retry policy. Budget spent:
        # this job probably breaks its own connection; fail it for good.
        retry = None if policy.retry_on_connection_loss else policy
        return classify_failure(claimed, exception, task=task, policy=retry)
    return Outcome(
        kind="interrupted",
        exception=exception,
        errors=[*row["errors"], error_of(exception)],
        retry_in=min(30.0, 0.5 * 2**lost),
    )


def classify_error(
    claimed: ClaimedJob,
    error: BaseException,
    *,
    task: Task,
    result: TaskResult,
    stop_asked: bool,
    cancelled_error: bool,
    connection_lost: bool,
    policy: RetryPolicy,
) -> Outcome:
    """What an attempt whose task function raised ``error`` came to.

    ``cancelled_error``: ``error`` is the stop request itself (``JobCancelled``
    or asyncio's cancellation); it discards the attempt only if the worker
    asked (``stop_asked``), else the task raised it on its own: an error.
    ``connection_lost``: the database connection broke under the task.
    Anything else, ``SystemExit`` included, fails the attempt, not the thread.
    """
    if cancelled_error and stop_asked:
        return Outcome(kind="discarded", exception=error, task_result=result)
    if connection_lost and not cancelled_error:
        return classify_interruption(claimed, error, task=task, policy=policy)
    return classify_failure(claimed, error, task=task, policy=policy)


def succeeded(result: TaskResult | None, value: Any) -> Outcome:
    """An attempt whose task function returned ``value``, already encoded as JSON.

    ``result`` None: nothing observes the success (see ``attempt.prepare``),
    so no ``task_finished`` is sent for it.
    """
    if result is not None:
        _with_status(result, TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", value)
    return Outcome(kind="succeeded", return_value=value, task_result=result)
