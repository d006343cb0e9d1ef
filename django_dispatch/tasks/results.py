"""TaskResults from job rows, and the ``django.tasks`` signals about them.

``get_result``, the worker, replays and the scheduler all show a job as
Django's ``TaskResult``: built here from a row's values, or, for a job just
inserted, from what the insert returned without reading the row back.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any

from ..compat import (
    TASKS_LOGGER,
    BaseTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultStatus,
    log_task_enqueued,
    log_task_finished,
    log_task_started,
    task_enqueued,
    task_finished,
    task_started,
)
from ..conf import generation
from ..conf.redaction import error_redactor
from ..core.failures import redacted, redacted_code
from ..core.states import JobState, to_status
from ..models import Job
from ..store import error_entry
from .task import task_for_row

logger = logging.getLogger("django_dispatch")

CANCELLED_ERROR_PATH = "django_dispatch.exceptions.JobCancelled"


def error_of(exception: BaseException) -> dict[str, str]:
    """One attempt's ``exception`` as stored in ``Job.errors`` (and a workflow step's):
    its code, and its message and traceback through ``DISPATCH["ERROR_REDACTOR"]``."""
    cls = type(exception)
    redactor = error_redactor()
    return error_entry(
        f"{cls.__module__}.{cls.__qualname__}",
        redacted(str(exception), redactor),
        redacted("".join(traceback.format_exception(exception)), redactor),
        code=redacted_code(exception, redactor),
    )


def task_errors(errors: list[dict[str, Any]], state: str) -> list[TaskError]:
    """A row's stored errors as Django's TaskErrors; a cancelled job's ends with JobCancelled."""
    result: list[TaskError] = [
        TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
        for e in errors
    ]
    if state == JobState.CANCELLED:
        result.append(
            TaskError(
                exception_class_path=CANCELLED_ERROR_PATH,
                traceback=f"{CANCELLED_ERROR_PATH}: the job was cancelled\n",
            )
        )
    return result


def result_from_values(
    values: Mapping[str, Any], *, task: Task | None = None, status: str | None = None
) -> TaskResult:
    """A TaskResult from a job row's values (a Job's fields or a claim row)."""
    state = values["state"]
    result: TaskResult[Any, Any] = TaskResult(
        task=task or task_for_row(values),
        id=str(values["id"]),
        status=TaskResultStatus(status) if status else to_status(state),
        enqueued_at=values["enqueued_at"],
        started_at=values["started_at"],
        finished_at=values["finished_at"],
        last_attempted_at=values["last_attempted_at"],
        args=values["args"],
        kwargs=values["kwargs"],
        backend=values["backend"],
        errors=task_errors(values["errors"], state),
        worker_ids=list(values["worker_ids"]),
    )
    if state == JobState.SUCCEEDED:
        object.__setattr__(result, "_return_value", values["return_value"])
    return result


def result_from_job(job: Job, *, task: Task | None = None) -> TaskResult:
    values = {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}
    return result_from_values(values, task=task)


def ready_result(
    task: Task,
    job_id: int,
    enqueued_at: datetime,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
) -> TaskResult:
    """The TaskResult of a job just inserted: what ``get_result`` returns until it is claimed.

    ``args`` and ``kwargs`` are already JSON round-tripped. Equal to
    ``result_from_values`` of the new row, without building the row.
    """
    return TaskResult(
        task=task,
        id=str(job_id),
        status=TaskResultStatus.READY,
        enqueued_at=enqueued_at,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[],
        worker_ids=[],
    )


#: The fields ``ready_results`` sets; if Django's TaskResult has others, it
#: uses the constructor instead.
_READY_FIELDS = (
    "task",
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "args",
    "kwargs",
    "backend",
    "errors",
    "worker_ids",
    "_return_value",
)
_SET_FIELDS_DIRECTLY = {f.name for f in fields(TaskResult)} == set(_READY_FIELDS)


def ready_results(
    task: Task,
    ids: Sequence[int],
    enqueued_ats: Sequence[datetime],
    calls: Iterable[Sequence[Any]],
    backend: str,
) -> list[TaskResult]:
    """``ready_result`` of many new jobs: ``calls`` holds each job's [args, kwargs].

    ``TaskResult.__post_init__`` passes args and kwargs through
    ``normalize_json``, a recursive copy that was a third of the time of
    ``enqueue_many`` for 100,000 noop calls. The values here were just decoded
    from JSON, one fresh object per call, so ``normalize_json`` would return
    equal copies of them: the results are built without it, same class, same
    field values (``tests/store/test_enqueue.py`` compares them with
    constructed ones). Should Django's TaskResult gain a field, this falls
    back to the constructor.
    """
    if not _SET_FIELDS_DIRECTLY:
        return [
            ready_result(task, job_id, enqueued_at, args, kwargs, backend)
            for job_id, enqueued_at, (args, kwargs) in zip(ids, enqueued_ats, calls, strict=True)
        ]
    new = object.__new__
    set_ = object.__setattr__
    ready = TaskResultStatus.READY
    results = []
    for job_id, enqueued_at, (args, kwargs) in zip(ids, enqueued_ats, calls, strict=True):
        result = new(TaskResult)
        set_(result, "task", task)
        set_(result, "id", str(job_id))
        set_(result, "status", ready)
        set_(result, "enqueued_at", enqueued_at)
        set_(result, "started_at", None)
        set_(result, "finished_at", None)
        set_(result, "last_attempted_at", None)
        set_(result, "args", args)
        set_(result, "kwargs", kwargs)
        set_(result, "backend", backend)
        set_(result, "errors", [])
        set_(result, "worker_ids", [])
        set_(result, "_return_value", None)
        results.append(result)
    return results


# --- signals ---------------------------------------------------------------------


#: Each backend alias's class, the sender of its tasks' signals (see ``signal_sender``).
#: The senders by backend alias, and the ``TASKS`` generation they were read under.
_senders: dict[str, type] = {}
_senders_generation = -1


def signal_sender(task: Task) -> type:
    """The sender of ``task``'s signals: its backend's class, as Django's own backends send.

    Kept per backend alias: Django's backends are per thread, and looking one
    up costs microseconds, once per job. Forgotten when ``TASKS`` changes.
    """
    global _senders_generation
    if _senders_generation != generation("TASKS"):
        _senders.clear()
        _senders_generation = generation("TASKS")
    try:
        return _senders[task.backend]
    except KeyError:
        sender = _senders[task.backend] = type(task.get_backend())
        return sender


def send_robust(signal: Any, sender: BaseTaskBackend | type, task_result: TaskResult) -> None:
    """Send a django.tasks signal; a failing receiver is logged, never raised.

    ``sender`` is a backend or its class (what is sent is the class). A
    receiver's bug must not change a job's outcome or break an enqueue.
    """
    if not isinstance(sender, type):
        sender = type(sender)
    for receiver_, response in signal.send_robust(sender=sender, task_result=task_result):
        if isinstance(response, Exception):
            logger.error(
                "signal receiver %r failed for job %s",
                receiver_,
                task_result.id,
                exc_info=(type(response), response, response.__traceback__),
            )


def enqueued_signal_is_silent(backend: BaseTaskBackend) -> bool:
    """True when sending ``task_enqueued`` for ``backend`` would have no observable effect.

    ``enqueue_many`` then skips the signal (see there). See ``signal_is_silent``.
    """
    return signal_is_silent(task_enqueued, type(backend))


#: Django's own receiver of each task signal, and the level it logs a
#: success at (a failure's ``task_finished`` logs at ERROR: never silent).
_OWN_RECEIVERS: dict[Any, tuple[Any, int]] = {
    task_enqueued: (log_task_enqueued, logging.DEBUG),
    task_started: (log_task_started, logging.INFO),
    task_finished: (log_task_finished, logging.INFO),
}
#: ``signal_is_silent``'s answers by (signal, sender), each with the receivers
#: it was read from: an answer stands while the signal's receivers are the same
#: connections (``connect`` and ``disconnect`` change the list's entries).
_silence: dict[tuple[Any, type], tuple[tuple[int, ...], bool]] = {}
#: The logger Django's receivers write to: ``getLogger`` takes the logging
#: module's lock at every call, and a logger, once made, is never replaced.
_TASKS_LOG = logging.getLogger(TASKS_LOGGER)


def signal_is_silent(signal: Any, sender: type) -> bool:
    """True when sending ``signal`` (a success's) from ``sender`` would have no observable effect.

    That is when the only receiver connected is Django's own log receiver and
    the tasks logger it writes to would drop its record. The worker then
    neither builds the job's ``TaskResult`` nor sends the signal: two signals
    and a result per job were a tenth of a worker's CPU in a drain of short
    jobs, for records nobody keeps. Anything unexpected (another receiver,
    an async one, a change in Django's signal internals) answers False: the
    signal is sent. The logger's level is read at every call (cheap: the
    logging module caches it), the receivers only when they change.
    """
    return only_own_receivers(signal, sender) and not _TASKS_LOG.isEnabledFor(
        _OWN_RECEIVERS[signal][1]
    )


def only_own_receivers(signal: Any, sender: type) -> bool:
    """True when Django's own log receiver is all that ``signal`` from ``sender``
    would call: no user code (see ``signal_is_silent``)."""
    own, _ = _OWN_RECEIVERS[signal]
    try:
        connected = tuple(map(id, signal.receivers))
        cached = _silence.get((signal, sender))
        if cached is None or cached[0] != connected:
            sync_receivers, async_receivers = signal._live_receivers(sender)
            only_own = not async_receivers and all(r is own for r in sync_receivers)
            _silence[(signal, sender)] = cached = (connected, only_own)
    except Exception:
        return False
    return cached[1]
