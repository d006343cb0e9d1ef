"""The ``django.tasks`` backend: Django's Tasks API over the job table.

``DispatchBackend.__init__`` touches no model and no database: Django builds
backends lazily, per thread, and may do so before migrations have run.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import router
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import log_task_enqueued, task_enqueued
from django.utils.module_loading import import_string

from . import store
from .exceptions import InvalidTaskArguments, UnknownTask
from .limits import JSONTooLarge, check_size
from .models import Job
from .retry import Backoff, exponential_backoff
from .states import JobState, to_status
from .store.enqueue import JobSpec, job_insert_call

logger = logging.getLogger("django_dispatch")

KEY_MAX_LENGTH = 255
KNOWN_OPTIONS = {"MAX_ATTEMPTS", "BACKOFF"}
CANCELLED_ERROR_PATH = "django_dispatch.exceptions.JobCancelled"


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchTask(Task):
    """A ``django.tasks.Task`` with django_dispatch's options.

    ``max_attempts``, ``backoff`` and ``timeout`` follow Django's open
    proposals for retries (django/new-features #142) and timeouts (#144);
    None means the backend's default (``OPTIONS["MAX_ATTEMPTS"]``,
    ``OPTIONS["BACKOFF"]``, no timeout).
    """

    max_attempts: int | None = None
    backoff: Backoff | None = None
    timeout: float | None = None
    partition_key: str | None = None
    idempotency_key: str | None = None

    def using(  # type: ignore[override]
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        partition_key: str | None = None,
        idempotency_key: str | None = None,
    ) -> DispatchTask:
        """A copy of this task with per-enqueue options changed."""
        changes: dict[str, Any] = {
            "priority": priority,
            "queue_name": queue_name,
            "run_after": run_after,
            "backend": backend,
            "partition_key": partition_key,
            "idempotency_key": idempotency_key,
        }
        return _replace(self, validate=True, **{k: v for k, v in changes.items() if v is not None})


def _replace(task: Task, *, validate: bool, **changes: Any) -> Any:
    """``dataclasses.replace`` that can skip validation.

    A row already in the table is history: rebuilding its Task must not fail
    because, say, its queue was since removed from ``QUEUES``.
    """
    if validate:
        from dataclasses import replace

        return replace(task, **changes)
    new = object.__new__(type(task))
    for f in fields(task):
        object.__setattr__(new, f.name, changes.get(f.name, getattr(task, f.name)))
    return new


#: What ``json.dumps(value, allow_nan=False)`` and ``json.loads(text)`` use,
#: made once: ``json.dumps`` builds a new encoder per call when given options.
JSON_ENCODER = json.JSONEncoder(allow_nan=False)
JSON_DECODER = json.JSONDecoder()


def json_text(value: Any, what: str) -> str:
    """The strict JSON text of ``value``, storable by any database, or InvalidTaskArguments."""
    try:
        text = JSON_ENCODER.encode(value)
        check_storable_json(text)
    except (TypeError, ValueError) as e:
        raise InvalidTaskArguments(
            f"{what} must be JSON-serializable ({e}). Pass ids and plain data "
            "(str, int, float, bool, None, lists, dicts with str keys), not objects."
        ) from e
    return text


def encode_json(value: Any, what: str, limit: str | None = None) -> tuple[str, Any]:
    """(JSON text of ``value``, ``value`` after a strict JSON round trip), or InvalidTaskArguments.

    The round trip is what the worker will see (tuples become lists), so the
    TaskResult returned at enqueue equals the one read back later. ``limit``
    names the ``DISPATCH`` setting bounding the text's size (see
    ``limits``); it is checked before the text is decoded.
    """
    text = json_text(value, what)
    if limit is not None:
        check_size(len(text), what, limit)
    return text, JSON_DECODER.decode(text)


#: ``\u0000`` as an escape, not as the text of an escaped backslash (``\\u0000``).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_storable_json(text: str) -> None:
    """ValueError if JSON text holds what a JSON column cannot store.

    PostgreSQL's jsonb refuses the NUL character and unpaired UTF-16
    surrogates. Caught here, a task's bad argument is a clear error at
    enqueue, and a bad return value fails its job (not retried) instead of
    failing the whole wave of completions it was written with. ``text`` is
    ASCII (``ensure_ascii``): both show up as ``\\u`` escapes, so the common
    case is two substring searches.
    """
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise ValueError("it contains a NUL character (\\u0000), which databases cannot store")
    if "\\ud" in text or "\\uD" in text:
        try:
            json.dumps(JSON_DECODER.decode(text), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                "it contains an unpaired UTF-16 surrogate, which databases cannot store"
            ) from None


def to_json(value: Any, what: str, limit: str | None = "MAX_RESULT_BYTES") -> Any:
    """``value`` after a strict JSON round trip, or InvalidTaskArguments (see ``encode_json``).

    Bounded by ``DISPATCH["MAX_RESULT_BYTES"]`` unless ``limit`` names
    another size limit: the executor stores a task's return value through
    here, so a value too big to store fails its job (not retried: the same
    code would return it again) before anything is written.
    """
    return encode_json(value, what, limit)[1]


@functools.lru_cache(maxsize=1024)
def _signature(func: Any) -> inspect.Signature:
    return inspect.signature(func)


def check_arguments(task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Raise InvalidTask when the task function cannot accept these arguments."""
    signature = _signature(task.func)
    call_args = (None, *args) if task.takes_context else tuple(args)
    try:
        signature.bind(*call_args, **kwargs)
    except TypeError as e:
        raise InvalidTaskArguments(
            f"{task.module_path}{signature} cannot be called with args={list(args)!r} "
            f"kwargs={dict(kwargs)!r}: {e}."
        ) from e


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _plain_arity(task: Task) -> int | None:
    """How many positional arguments the task takes, if that is all it takes.

    For a function with only required positional parameters, a call with
    exactly that many positional arguments and no keyword argument always
    binds, so ``check_arguments`` has nothing to say about it. None for any
    other signature (defaults, keyword-only, ``*args``, ``**kwargs``).
    """
    parameters = _signature(task.func).parameters.values()
    if all(p.kind in _POSITIONAL and p.default is p.empty for p in parameters):
        return len(parameters) - (1 if task.takes_context else 0)
    return None


@dataclass(frozen=True, slots=True)
class EnqueuePlan:
    """What every enqueue of one task on one backend shares, worked out once.

    ``task`` passed ``validate_task``; ``spec`` holds the job columns it
    determines; ``arity`` is ``_plain_arity(task)``.
    """

    task: Task
    spec: JobSpec
    arity: int | None

    def check(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        """``check_arguments``, skipped when the call cannot fail to bind."""
        if kwargs or self.arity is None or len(args) != self.arity:
            check_arguments(self.task, args, kwargs)

    def encode_call(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any], str, str]:
        """Validate one call: (args, kwargs) after the JSON round trip, and their JSON text.

        The arguments' size is measured on the text about to be stored (a
        ``len()``), before it is decoded: an oversized call costs no decode.
        """
        args_text = json_text(list(args), "Task arguments")
        kwargs_text = json_text(dict(kwargs), "Task keyword arguments")
        check_size(
            len(args_text) + len(kwargs_text),
            f"The arguments of {self.task.module_path}",
            "MAX_ARGS_BYTES",
        )
        json_args, json_kwargs = JSON_DECODER.decode(args_text), JSON_DECODER.decode(kwargs_text)
        self.check(json_args, json_kwargs)
        return json_args, json_kwargs, args_text, kwargs_text


#: Tasks whose plan one backend keeps; past that the cache starts over (tasks
#: made per call with ``using(partition_key=...)`` must not grow it forever).
PLAN_CACHE_SIZE = 512


class DispatchBackend(BaseTaskBackend):
    """Durable jobs in the database, run by ``manage.py rundispatch``."""

    task_class = DispatchTask
    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.default_max_attempts = self.options.get("MAX_ATTEMPTS", 1)
        backoff = self.options.get("BACKOFF", exponential_backoff)
        self._backoff_setting = backoff
        self._plans: dict[Task, EnqueuePlan] = {}

    @property
    def default_backoff(self) -> Backoff:
        backoff = self._backoff_setting
        return import_string(backoff) if isinstance(backoff, str) else backoff

    # --- validation ----------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        """Django's rules, then ours. Runs at definition and again at enqueue."""
        super().validate_task(task)
        if not isinstance(task, DispatchTask):
            return
        if task.max_attempts is not None and (
            not isinstance(task.max_attempts, int)
            or isinstance(task.max_attempts, bool)
            or task.max_attempts < 1
        ):
            raise InvalidTask(
                f"max_attempts must be a whole number of at least 1, got {task.max_attempts!r}."
            )
        if task.timeout is not None and (
            not isinstance(task.timeout, int | float)
            or isinstance(task.timeout, bool)
            or task.timeout <= 0
        ):
            raise InvalidTask(
                f"timeout must be a positive number of seconds, got {task.timeout!r}."
            )
        if task.backoff is not None and not callable(task.backoff):
            raise InvalidTask(
                "backoff must be a function (exception, task_result) -> seconds or None, "
                f"got {task.backoff!r}."
            )
        for name in ("partition_key", "idempotency_key"):
            value = getattr(task, name)
            if value is not None and (
                not isinstance(value, str) or not value or len(value) > KEY_MAX_LENGTH
            ):
                raise InvalidTask(
                    f"{name} must be a non-empty string of at most {KEY_MAX_LENGTH} "
                    f"characters, got {value!r}."
                )

    def max_attempts_for(self, task: Task) -> int:
        return getattr(task, "max_attempts", None) or self.default_max_attempts

    def backoff_for(self, task: Task) -> Backoff:
        """The task's backoff (or the default), never retrying a value over a size limit."""
        return functools.partial(
            _no_retry_when_too_large, getattr(task, "backoff", None) or self.default_backoff
        )

    # --- enqueue -------------------------------------------------------------

    def enqueue_plan(self, task: Task) -> EnqueuePlan:
        """Validate ``task`` for enqueueing and work out what its enqueues share.

        ``validate_task`` runs at definition and, through this, again at
        enqueue. Its verdict and the job columns the task determines depend
        only on the task's fields and this backend's configuration (Django
        builds a new backend when ``TASKS`` changes), so they are kept per
        task, equal tasks sharing one entry. Not for a task with ``run_after``:
        whether that is valid also depends on ``USE_TZ``, and such tasks are
        usually made for one enqueue.
        """
        cacheable = task.run_after is None
        if cacheable:
            try:
                return self._plans[task]
            except KeyError:
                pass
            except TypeError:  # an unhashable option: validate_task says what is wrong
                cacheable = False
        self.validate_task(task)
        plan = EnqueuePlan(
            task=task,
            spec=JobSpec.of(
                task_path=task.module_path,
                backend=self.alias,
                queue_name=task.queue_name,
                priority=task.priority,
                deferred_until=task.run_after,
                partition_key=getattr(task, "partition_key", None),
                idempotency_key=getattr(task, "idempotency_key", None),
                max_attempts=self.max_attempts_for(task),
            ),
            arity=_plain_arity(task),
        )
        if cacheable:
            if len(self._plans) >= PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[task] = plan
        return plan

    def build_job(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Job:
        """Validate one call and turn it into an unsaved Job. Writes nothing."""
        plan = self.enqueue_plan(task)
        json_args, json_kwargs, _, _ = plan.encode_call(args, kwargs)
        return plan.spec.new_job(json_args, json_kwargs)

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        """Insert one job in the caller's transaction and return its TaskResult.

        With an idempotency key held by a live job of the same task, nothing
        is inserted and that job's TaskResult is returned instead.
        """
        plan = self.enqueue_plan(task)
        json_args, json_kwargs, args_text, kwargs_text = plan.encode_call(args, kwargs)
        db = store.db_alias()
        if plan.spec.idempotency_key is None:
            job_id, enqueued_at = job_insert_call(
                plan.spec, json_args, json_kwargs, args_text, kwargs_text, db=db
            )
            result = ready_result(task, job_id, enqueued_at, json_args, json_kwargs, self.alias)
        else:
            job, created = store.job_insert_idempotent(
                plan.spec.new_job(json_args, json_kwargs), db=db
            )
            if not created:
                return result_from_job(job)
            result = result_from_job(job, task=task)
        send_robust(task_enqueued, self, result)
        return result

    # --- results -------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        try:
            pk = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.using(router.db_for_read(Job)).filter(pk=pk).first()
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        return result_from_job(job)

    # --- checks --------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages: list[checks.CheckMessage] = []
        if not apps.is_installed("django_dispatch"):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses DispatchBackend but django_dispatch is not "
                    "in INSTALLED_APPS.",
                    hint="Add 'django_dispatch' to INSTALLED_APPS and run migrate.",
                    id="django_dispatch.E001",
                )
            )
        unknown = sorted(set(self.options) - KNOWN_OPTIONS)
        if unknown:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS'] has unknown keys {unknown}.",
                    hint=f"Known options: {sorted(KNOWN_OPTIONS)}. Check the spelling.",
                    id="django_dispatch.E002",
                )
            )
        max_attempts = self.default_max_attempts
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be a whole number "
                    f"of at least 1, got {max_attempts!r}.",
                    id="django_dispatch.E003",
                )
            )
        try:
            backoff_ok = callable(self.default_backoff)
        except ImportError:
            backoff_ok = False
        if not backoff_ok:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['BACKOFF'] must be a function or the "
                    f"import path of one, got {self._backoff_setting!r}.",
                    id="django_dispatch.E004",
                )
            )
        return messages


def _no_retry_when_too_large(
    backoff: Backoff, exception: BaseException, task_result: TaskResult
) -> float | None:
    """``backoff``'s answer, except None (stop) for a value over its size limit.

    A checkpoint too big for ``DISPATCH["MAX_CHECKPOINT_BYTES"]`` (raised by
    ``context.progress()`` through the task), or a child job's arguments too
    big to enqueue, would be just as big on the next attempt: retrying only
    spends attempts. (A return value too big is failed without retry by the
    executor itself.)
    """
    if isinstance(exception, JSONTooLarge):
        return None
    return backoff(exception, task_result)


def send_robust(signal: Any, backend: BaseTaskBackend | type, task_result: TaskResult) -> None:
    """Send a django.tasks signal; a failing receiver is logged, never raised.

    A receiver's bug must not change a job's outcome or break an enqueue.
    """
    sender = backend if isinstance(backend, type) else type(backend)
    for receiver, response in signal.send_robust(sender=sender, task_result=task_result):
        if isinstance(response, Exception):
            logger.error(
                "signal receiver %r failed for job %s",
                receiver,
                task_result.id,
                exc_info=(type(response), response, response.__traceback__),
            )


def enqueued_signal_is_silent(backend: BaseTaskBackend) -> bool:
    """True when sending ``task_enqueued`` for ``backend`` would have no observable effect.

    That is when the only receiver connected is Django's own
    ``log_task_enqueued`` and the ``django.tasks`` logger it writes to would
    drop its DEBUG record. ``enqueue_many`` then skips the signal (see there).
    Anything unexpected (another receiver, an async one, a change in Django's
    signal internals) answers False: the signal is sent.
    """
    try:
        sync_receivers, async_receivers = task_enqueued._live_receivers(type(backend))
    except Exception:
        return False
    if async_receivers or any(r is not log_task_enqueued for r in sync_receivers):
        return False
    return not logging.getLogger("django.tasks").isEnabledFor(logging.DEBUG)


# --- rebuilding TaskResults from rows ------------------------------------------


def task_for_row(row: Mapping[str, Any]) -> Task:
    """The registered Task a job row names, with the row's per-enqueue options.

    Only objects that are ``django.tasks.Task`` instances run: a row written by
    someone else cannot make a worker import and call an arbitrary callable.
    """
    path = row["task_path"]
    try:
        task = import_string(path)
    except ImportError as e:
        raise UnknownTask(
            f"Task {path!r} cannot be imported ({e}). If it was renamed or moved, "
            "keep an alias at the old path until its jobs have drained."
        ) from e
    except Exception as e:  # the module itself fails to import: a bug or a setting
        raise UnknownTask(
            f"Importing task {path!r} failed with {type(e).__name__}: {e}. Fix the module."
        ) from e
    if not isinstance(task, Task):
        raise UnknownTask(
            f"{path!r} is a {type(task).__name__}, not a Task: only functions decorated "
            "with @task can run as jobs."
        )
    changes: dict[str, Any] = {
        "priority": row["priority"],
        "queue_name": row["queue_name"],
        "run_after": row["deferred_until"],
        "backend": row["backend"] or task.backend,  # None: the task's own backend
    }
    if isinstance(task, DispatchTask):
        changes["partition_key"] = row["partition_key"]
        changes["idempotency_key"] = row["idempotency_key"]
    return _replace(task, validate=False, **changes)


def task_errors(errors: list[dict[str, Any]], state: str) -> list[TaskError]:
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
    field values (``tests/test_enqueue_fast.py`` compares them with
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


def result_from_job(job: Job, *, task: Task | None = None) -> TaskResult:
    values = {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}
    return result_from_values(values, task=task)


def backend_for(alias: str) -> DispatchBackend | None:
    """The DispatchBackend configured under ``alias``, or None."""
    from django.tasks import task_backends

    try:
        backend = task_backends[alias]
    except Exception:
        return None
    return backend if isinstance(backend, DispatchBackend) else None
