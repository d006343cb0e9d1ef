"""Run one claimed job and classify what happened. No database I/O here.

The outcome is one of: succeeded (with a JSON return value), retry (with a
delay), failed (for good), discarded (the job was cancelled or lost while
it ran, so whatever it produced must not be written), interrupted (the
database connection broke under the task code: run again, counted as a lost
worker, see ``store.interruptions``) or released (task code never started:
hand the job back as if it had not been claimed). Persisting the outcome is
the completer's job.

Where the line is for database faults: before the task function is called
(connection checks, task resolution), a fault costs the job nothing, it is
*released*. Once task code has run it may have had side effects, so a second
run is an at-least-once re-execution; it is still the default
(``DISPATCH["RETRY_ON_CONNECTION_LOSS"]``), because the alternative loses the
job to a fault that was not its own, and tasks must be idempotent anyway
(any worker crash re-runs them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from inspect import iscoroutinefunction
from typing import Any, Literal

from asgiref.sync import async_to_sync

from ..compat import InvalidTask, Task, TaskError, TaskResult, TaskResultStatus, task_started
from ..conf import get_settings
from ..context import DispatchTaskContext
from ..dispatch_task import check_arguments, task_for_row
from ..encoding import to_json
from ..enqueue import backend_for
from ..exceptions import JobCancelled, TaskTimeout, UnknownTask
from ..results import error_of, result_from_values, send_robust, signal_sender
from ..retry import exponential_backoff, next_delay
from ..states import JobState
from ..store import ClaimedJob
from .connections import lost_connection

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


@dataclass
class RunningJob:
    """What the worker tracks about a job while it runs on a thread."""

    claimed: ClaimedJob
    lease_seconds: float
    #: The Task its row names, resolved once per job (``resolve``, on the job
    #: thread, before its clock starts) for the executor and the timeouts;
    #: None until then, or when it cannot be resolved (``unknown`` says why).
    task: Task | None = None
    unknown: UnknownTask | None = None
    deadline: float | None = None  # monotonic; None: no timeout or not started
    #: When a job thread picked it up (monotonic); None while it waits, claimed ahead.
    begun_at: float | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event)
    abandoned: bool = False  # timed out or handed back: its result is dropped
    # Batched completion: the outcome waiting for the control loop's write,
    # then whether that write won (None: it failed, write it one by one).
    finished: Outcome | None = None
    #: Set (by the control loop) once that write is over. A plain flag, not
    #: an Event: nothing blocks on it, and an Event per job (a Condition and
    #: a Lock) was a measurable share of a no-op job's CPU.
    persisted: bool = False
    won: bool | None = False
    #: Called (from the control loop) once ``persisted`` is set: how the
    #: asyncio executor learns it without a thread waiting.
    on_persisted: Callable[[], None] | None = None
    #: Runs on this process's event loop (``asyncjobs``), not a job thread.
    on_loop: bool = False
    #: The attempt's meter (``metering.Meter``) while its success waits for
    #: the wave that writes its usage record, its thread gone on to another job.
    meter: Any = None
    _loop: asyncio.AbstractEventLoop | None = None
    _atask: asyncio.Task[Any] | None = None

    def stop(self) -> None:
        """Ask the job to stop: flag for sync tasks, cancellation for async ones."""
        self.cancel_event.set()
        loop, atask = self._loop, self._atask
        if loop is not None and atask is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(atask.cancel)


def resolve(running: RunningJob) -> Task | None:
    """The job's Task, imported and rebuilt from its row once: later calls return it.

    None when the row names no task that can run (``running.unknown`` holds
    the error, which fails the job when it would start).
    """
    if running.task is None and running.unknown is None:
        try:
            running.task = task_for_row(running.claimed.row)
        except UnknownTask as e:
            running.unknown = e
    return running.task


def is_async(running: RunningJob) -> bool:
    """Whether the job's task is an ``async def`` (resolving it; see ``resolve``)."""
    task = resolve(running)
    return task is not None and iscoroutinefunction(task.func)


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
    retryable: bool = True,
) -> Outcome:
    """Decide retry or failure for an attempt that raised ``exception``."""
    row = claimed.row
    errors = [*row["errors"], error_of(exception)]
    result = running_result(claimed, task) if task is not None else None
    delay = None
    if retryable and task is not None and result is not None:
        object.__setattr__(
            result,
            "errors",
            [
                TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
                for e in errors
            ],
        )
        backend = backend_for(row["backend"])
        backoff = backend.backoff_for(task) if backend else exponential_backoff
        try:
            delay = next_delay(
                # Attempts lost to dead workers do not count against the budget.
                attempts=row["attempts"] - row["worker_lost_count"],
                max_attempts=row["max_attempts"],
                backoff=backoff,
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


def classify_interruption(claimed: ClaimedJob, exception: BaseException, *, task: Task) -> Outcome:
    """Run again without spending an attempt, unless the lost-worker budget is spent."""
    cfg = get_settings()
    row = claimed.row
    lost = row["worker_lost_count"] + 1
    if not cfg.RETRY_ON_CONNECTION_LOSS or lost >= cfg.MAX_WORKER_LOST:
        # Off: an ordinary exception under the task's retry policy. Budget spent:
        # this job probably breaks its own connection; fail it for good.
        return classify_failure(
            claimed, exception, task=task, retryable=not cfg.RETRY_ON_CONNECTION_LOSS
        )
    return Outcome(
        kind="interrupted",
        exception=exception,
        errors=[*row["errors"], error_of(exception)],
        retry_in=min(30.0, 0.5 * 2**lost),
    )


@dataclass
class Prepared:
    """A job ready for its task function: what ``prepare`` found, for ``conclude``."""

    task: Task
    result: TaskResult
    args: list[Any]
    kwargs: dict[str, Any]
    timeout: float | None


def prepare(claimed: ClaimedJob, running: RunningJob) -> Outcome | Prepared:
    """Everything before task code: resolve, check arguments, ``task_started``.

    An ``Outcome`` when the attempt ends here (cancelled while it waited,
    a task that cannot run). ``task_started`` receivers are user code: call
    this where they may use the database (a job thread, or the asyncio
    executor's sync thread), never on an event loop.
    """
    row = claimed.row
    if running.cancel_event.is_set():  # cancelled while waiting for a thread
        return Outcome(kind="discarded")
    # Retrying cannot help a task that does not import or arguments that do
    # not fit: fail the job, keep the worker.
    task = resolve(running)
    if task is None:
        assert running.unknown is not None
        return classify_failure(claimed, running.unknown, task=None, retryable=False)
    try:
        check_arguments(task, row["args"], row["kwargs"])
    except InvalidTask as e:
        return classify_failure(claimed, e, task=None, retryable=False)

    result = running_result(claimed, task)
    send_robust(task_started, signal_sender(task), result)
    args, kwargs = list(row["args"]), dict(row["kwargs"])
    if task.takes_context:
        context = DispatchTaskContext(
            task_result=result,
            lease=claimed.lease,
            lease_seconds=running.lease_seconds,
            cancel_event=running.cancel_event,
            saved_checkpoint=row["checkpoint"],
        )
        args.insert(0, context)
    return Prepared(task, result, args, kwargs, getattr(task, "timeout", None))


def conclude(
    claimed: ClaimedJob,
    running: RunningJob,
    prepared: Prepared,
    *,
    value: Any = None,
    error: BaseException | None = None,
) -> Outcome:
    """Classify what the task function did: returned ``value`` or raised ``error``."""
    task, result = prepared.task, prepared.result
    if isinstance(error, (JobCancelled, asyncio.CancelledError)):
        if running.cancel_event.is_set():  # we asked it to stop
            return Outcome(kind="discarded", exception=error, task_result=result)
        return classify_failure(claimed, error, task=task)  # raised on its own: an error
    if error is not None:  # SystemExit from a task fails the job, not the thread
        if lost_connection(error):
            return classify_interruption(claimed, error, task=task)
        return classify_failure(claimed, error, task=task)
    if running.cancel_event.is_set() or running.abandoned:
        return Outcome(kind="discarded", task_result=result)
    try:
        value = to_json(value, f"The return value of {task.module_path}")
    except InvalidTask as e:  # the same code would return the same value again
        return classify_failure(claimed, e, task=task, retryable=False)
    _with_status(result, TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    return Outcome(kind="succeeded", return_value=value, task_result=result)


def execute(claimed: ClaimedJob, running: RunningJob) -> Outcome:
    """Run the job's task function once, on this thread, and classify the result.

    An async task gets an event loop of its own for the attempt
    (``async_to_sync``); the asyncio executor (``asyncjobs``) runs many on one.
    """
    prepared = prepare(claimed, running)
    if isinstance(prepared, Outcome):
        return prepared
    task, args, kwargs = prepared.task, prepared.args, prepared.kwargs
    try:
        if iscoroutinefunction(task.func):
            value = async_to_sync(run_async)(task, args, kwargs, prepared.timeout, running)
        else:
            value = task.func(*args, **kwargs)
    except BaseException as e:
        return conclude(claimed, running, prepared, error=e)
    return conclude(claimed, running, prepared, value=value)


async def run_async(
    task: Task, args: list[Any], kwargs: dict[str, Any], timeout: float | None, running: RunningJob
) -> Any:
    """Run an async task on the running event loop, cancellable (``RunningJob.stop``) and timed."""
    running._loop = asyncio.get_running_loop()
    running._atask = asyncio.current_task()
    if running.cancel_event.is_set():
        raise JobCancelled(f"job {running.claimed.id} was cancelled before it started")
    try:
        async with asyncio.timeout(timeout):
            return await task.func(*args, **kwargs)
    except TimeoutError as e:
        raise TaskTimeout(f"{task.module_path} ran longer than its timeout of {timeout} s") from e
    finally:
        running._loop = running._atask = None
