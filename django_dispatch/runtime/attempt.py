"""One attempt of a claimed job: resolve its task, run the function once, classify.

The steps, in the order a job thread takes them (``jobthreads.JobRunner``;
the asyncio executor, ``asyncjobs``, takes the same ones with the task
awaited on its event loop): ``resolve`` the Task the row names, ``prepare``
(arguments checked, ``task_started``, the task context), call the function,
``conclude`` (what it returned or raised, handed to the pure ``executor``).

The retry policy is resolved here, from the job's backend and the settings,
and only for an attempt that raised: a success does no lookup.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from inspect import iscoroutinefunction
from operator import itemgetter
from typing import Any

from asgiref.sync import async_to_sync

from ..compat import InvalidTask, Task, TaskResult, task_finished, task_started
from ..conf import get_settings
from ..core.retry import exponential_backoff
from ..exceptions import JobCancelled, TaskTimeout, UnknownTask
from ..store import ClaimedJob
from ..tasks.context import DispatchTaskContext
from ..tasks.registry import backend_for
from ..tasks.results import send_robust, signal_is_silent, signal_sender
from ..tasks.task import check_arguments, task_for_row
from ..tasks.values import to_json
from . import executor
from .connections import lost_connection
from .executor import Outcome, RetryPolicy
from .running import RunningJob


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


#: The row's columns ``tasks.task.task_for_row`` builds the Task from: rows
#: that agree on all of them get the same Task (tests/runtime/test_resolve.py
#: checks that it reads no other).
TASK_COLUMNS = (
    "task_path",
    "priority",
    "queue_name",
    "backend",
    "deferred_until",
    "partition_key",
    "idempotency_key",
    "concurrency_key",
)
_task_key = itemgetter(*TASK_COLUMNS)


def resolve_claim(runs: list[RunningJob]) -> None:
    """``resolve`` of a claim's jobs, one lookup per distinct task and options.

    A claim of hundreds of jobs mostly names one task with one set of options;
    importing and rebuilding its Task again for each was a visible share of
    the control loop's CPU per job. Within one claim the imported object at a
    path does not change, and a Task is frozen: its jobs may share it. A task
    that does not resolve is looked up for each of its jobs (each gets its own
    error).
    """
    known: dict[tuple[Any, ...], Task] = {}
    for running in runs:
        if running.task is not None or running.unknown is not None:
            continue
        try:
            key = _task_key(running.claimed.row)
            task = known.get(key)
        except (KeyError, TypeError):  # a row without a column, or an unhashable value
            resolve(running)
            continue
        if task is not None:
            running.task = task
        elif (task := resolve(running)) is not None:
            known[key] = task


#: ``iscoroutinefunction`` by task function: asked two or three times per job,
#: and ``inspect`` unwraps methods and partials at every call. A function
#: does not change kind; the task functions of a process are few.
_COROUTINE: dict[Any, bool] = {}


def is_coroutine(func: Any) -> bool:
    """``inspect.iscoroutinefunction(func)``, remembered per function."""
    try:
        return _COROUTINE[func]
    except KeyError:
        known = _COROUTINE[func] = iscoroutinefunction(func)
        return known
    except TypeError:  # an unhashable callable: asked every time
        return iscoroutinefunction(func)


def is_async(running: RunningJob) -> bool:
    """Whether the job's task is an ``async def`` (resolving it; see ``resolve``)."""
    task = resolve(running)
    return task is not None and is_coroutine(task.func)


def retry_policy(claimed: ClaimedJob, task: Task) -> RetryPolicy:
    """How a failed attempt of ``claimed`` may be retried: its backend's backoff
    for ``task`` (the default when the alias is gone from ``TASKS``), its
    row's attempt budget, and the connection-loss settings."""
    cfg = get_settings()
    backend = backend_for(claimed.row["backend"])
    return RetryPolicy(
        max_attempts=claimed.row["max_attempts"],
        backoff=backend.backoff_for(task) if backend else exponential_backoff,
        retry_on_connection_loss=cfg.RETRY_ON_CONNECTION_LOSS,
        max_worker_lost=cfg.MAX_WORKER_LOST,
    )


def fail(
    claimed: ClaimedJob, exception: BaseException, *, task: Task | None, retryable: bool = True
) -> Outcome:
    """Retry or fail an attempt that raised ``exception``, under the job's retry policy."""
    policy = retry_policy(claimed, task) if retryable and task is not None else None
    return executor.classify_failure(claimed, exception, task=task, policy=policy)


@dataclass
class Prepared:
    """A job ready for its task function: what ``prepare`` found, for ``conclude``."""

    task: Task
    #: None when nothing would see it: no task context, and both signals
    #: silent (``tasks.results.signal_is_silent``). A failure builds its own.
    result: TaskResult | None
    args: list[Any]
    kwargs: dict[str, Any]
    timeout: float | None
    #: Whether a success's ``task_finished`` has a receiver that would see it.
    finished_observed: bool = True
    #: Whether ``task_started`` receivers (user code) ran: they may have used,
    #: or broken, this thread's connections.
    started_sent: bool = True


def prepare(
    claimed: ClaimedJob,
    running: RunningJob,
    *,
    silence: dict[Any, tuple[bool, bool]] | None = None,
) -> Outcome | Prepared:
    """Everything before task code: resolve, check arguments, ``task_started``.

    An ``Outcome`` when the attempt ends here (cancelled while it waited,
    a task that cannot run). ``task_started`` receivers are user code: call
    this where they may use the database (a job thread, or the asyncio
    executor's sync thread), never on an event loop.

    ``silence``: whether each sender's two signals are observed, kept by a
    caller preparing many jobs in a row; it must empty it whenever user code
    may have run since (a receiver may connect or drop receivers).
    """
    row = claimed.row
    # Cancelled while waiting for a thread, or handed back meanwhile (a stop
    # marks a job abandoned before it asks it to stop): its code must not start.
    if running.stop_requested or running.abandoned:
        return Outcome(kind="discarded")
    # Retrying cannot help a task that does not import or arguments that do
    # not fit: fail the job, keep the worker.
    task = resolve(running)
    if task is None:
        assert running.unknown is not None
        return executor.classify_failure(claimed, running.unknown, task=None, policy=None)
    try:
        check_arguments(task, row["args"], row["kwargs"])
    except InvalidTask as e:
        return executor.classify_failure(claimed, e, task=None, policy=None)

    sender = signal_sender(task)
    started, finished = _observed(sender, silence)
    result = None
    if started or finished or task.takes_context:
        result = executor.running_result(claimed, task)
    if started:
        assert result is not None
        send_robust(task_started, sender, result)
    args, kwargs = list(row["args"]), dict(row["kwargs"])
    if task.takes_context:
        assert result is not None
        atomic = getattr(task, "atomic", False)
        context = DispatchTaskContext(
            task_result=result,
            lease=claimed.lease,
            lease_seconds=running.lease_seconds,
            cancel_event=running.cancel_event,
            # An atomic attempt saves no checkpoint, and resumes from none:
            # its retry starts over, since the body rolled back.
            saved_checkpoint=None if atomic else row["checkpoint"],
            atomic=atomic,
            call_context=row.get("call_context"),
        )
        args.insert(0, context)
    return Prepared(
        task,
        result,
        args,
        kwargs,
        getattr(task, "timeout", None),
        finished_observed=finished,
        started_sent=started,
    )


def signal_receivers() -> tuple[int, int]:
    """How many receivers ``task_started`` and ``task_finished`` have: a change
    (a task module imported for the first time connected one) voids what a
    ``silence`` kept."""
    return len(task_started.receivers), len(task_finished.receivers)


def _observed(sender: type, silence: dict[Any, tuple[bool, bool]] | None) -> tuple[bool, bool]:
    """Whether ``task_started`` and ``task_finished`` from ``sender`` are observed,
    from ``silence`` when it holds the answer (see ``prepare``)."""
    observed = silence.get(sender) if silence is not None else None
    if observed is None:
        observed = (
            not signal_is_silent(task_started, sender),
            not signal_is_silent(task_finished, sender),
        )
        if silence is not None:
            silence[sender] = observed
    return observed


def conclude(
    claimed: ClaimedJob,
    running: RunningJob,
    prepared: Prepared,
    *,
    value: Any = None,
    error: BaseException | None = None,
) -> Outcome:
    """Classify what the task function did: returned ``value`` or raised ``error``.

    Run where the task ran (or, for an async task, on the thread whose
    connection it used): whether the connection was lost is read from it.
    """
    task, result = prepared.task, prepared.result
    if error is not None:
        if result is None:  # a failure is rare: its signal and backoff get a result
            result = executor.running_result(claimed, task)
        cancelled_error = isinstance(error, (JobCancelled, asyncio.CancelledError))
        return executor.classify_error(
            claimed,
            error,
            task=task,
            result=result,
            stop_asked=running.stop_requested,
            cancelled_error=cancelled_error,
            connection_lost=not cancelled_error and lost_connection(error),
            policy=retry_policy(claimed, task),
        )
    if running.stop_requested or running.abandoned:
        return Outcome(kind="discarded", task_result=result)
    try:
        value = to_json(value, f"The return value of {task.module_path}")
    except InvalidTask as e:  # the same code would return the same value again
        return executor.classify_failure(claimed, e, task=task, policy=None)
    return executor.succeeded(result if prepared.finished_observed else None, value)


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
        if is_coroutine(task.func):
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
    if running.stop_requested or running.abandoned:
        raise JobCancelled(f"job {running.claimed.id} was cancelled before it started")
    try:
        async with asyncio.timeout(timeout):
            return await task.func(*args, **kwargs)
    except TimeoutError as e:
        raise TaskTimeout(f"{task.module_path} ran longer than its timeout of {timeout} s") from e
    finally:
        running._loop = running._atask = None


async def run_untimed(prepared: Prepared, running: RunningJob) -> Any:
    """The task function, awaited (the asyncio executor): ``run_async`` without
    its timer when the task has no timeout (an ``asyncio.timeout`` per job is
    measurable)."""
    if prepared.timeout is not None:
        return await run_async(
            prepared.task, prepared.args, prepared.kwargs, prepared.timeout, running
        )
    running._loop = asyncio.get_running_loop()
    running._atask = asyncio.current_task()
    try:
        if running.stop_requested or running.abandoned:
            raise JobCancelled(f"job {running.claimed.id} was cancelled before it started")
        return await prepared.task.func(*prepared.args, **prepared.kwargs)
    finally:
        running._loop = running._atask = None
