"""``DispatchTask``, the task class of our backend, and the Task a job row names.

A job row holds a task's import path and its per-enqueue options; the worker,
the scheduler, replays and ``get_result`` turn it back into the Task with
``task_for_row``. ``check_arguments`` tells whether a call fits the task's
function. Nothing here touches the database.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from ..compat import InvalidTask, Task, TaskResult
from ..core.resources import AUTO, FrozenNeeds, check_locality, check_needs
from ..core.retry import Backoff
from ..exceptions import InvalidTaskArguments, UnknownTask
from ..models.job import KEY_MAX_LENGTH
from .call_context import checked as call_context_checked
from .options import check_concurrency


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchTask[**P, R](Task):
    """A ``django.tasks.Task`` with django_dispatch's options.

    Generic like django-stubs' ``Task[P, R]`` (the function's parameters and
    return type), so that a user's ``enqueue()`` calls and results type-check
    under ``mypy --strict``, ``using()`` with our options included.

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
    #: At most this many jobs of the task run at once, per ``concurrency_key``.
    concurrency_limit: int | None = None
    concurrency_key: str | None = None
    #: At most this many starts per window, e.g. "100/m" (``flow_options``).
    rate_limit: str | None = None
    #: Seconds after its job finished during which an ``idempotency_key`` still
    #: dedupes; None: the key is free again once the job has finished.
    unique_for: float | None = None
    #: A keyed job waiting for its retry: "hold" its partition (the default)
    #: or "yield" it to the next job (see docs/tasks.md).
    partition_retry: str = "hold"
    #: Resource needs: {name: whole number}, or "auto" (from usage history).
    resources: Mapping[str, int] | str | None = None
    locality: str | None = None
    #: Run the body in one transaction on the jobs' database, committed with
    #: the job's success under its lease (docs/tasks.md, "Exactly-once
    #: database effects"). Sync functions only.
    atomic: bool = False
    #: Who or what enqueues (a JSON object, stored as ``Job.call_context``);
    #: set per call with ``using(call_context=)``. Not compared nor hashed:
    #: tasks that differ only by it share one enqueue plan.
    call_context: Mapping[str, Any] | None = field(default=None, compare=False)

    if TYPE_CHECKING:  # typed as django-stubs types Task's; Django's code runs

        def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskResult[P, R]: ...
        async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskResult[P, R]: ...
        def get_result(self, result_id: str) -> TaskResult[P, R]: ...
        async def aget_result(self, result_id: str) -> TaskResult[P, R]: ...
        def call(self, *args: P.args, **kwargs: P.kwargs) -> R: ...
        async def acall(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    def __post_init__(self) -> None:
        if type(self.resources) is dict:  # hashable, so the task keeps its enqueue plan
            object.__setattr__(self, "resources", FrozenNeeds(self.resources))
        Task.__post_init__(self)

    def using(  # type: ignore[override]
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        partition_key: str | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        unique_for: float | None = None,
        resources: Mapping[str, int] | str | None = None,
        locality: str | None = None,
        call_context: Mapping[str, Any] | None = None,
    ) -> DispatchTask[P, R]:
        """A copy of this task with per-enqueue options changed.

        ``call_context``: a dict stored on the job (``Job.call_context``,
        ``context.call_context``), instead of ``DISPATCH["CALL_CONTEXT"]``'s.
        """
        if call_context is not None:  # InvalidTaskArguments naming it, before anything
            call_context = call_context_checked(call_context)[1]
        changes: dict[str, Any] = {
            "priority": priority,
            "queue_name": queue_name,
            "run_after": run_after,
            "backend": backend,
            "partition_key": partition_key,
            "idempotency_key": idempotency_key,
            "concurrency_key": concurrency_key,
            "unique_for": unique_for,
            "resources": resources,
            "locality": locality,
            "call_context": call_context,
        }
        return _replace(self, validate=True, **{k: v for k, v in changes.items() if v is not None})


def _replace(task: Task, *, validate: bool, **changes: Any) -> Any:
    """``dataclasses.replace`` that can skip validation.

    A row already in the table is history: rebuilding its Task must not fail
    because, say, its queue was since removed from ``QUEUES``.
    """
    if validate:
        return replace(task, **changes)
    cls = type(task)
    names = _FIELD_NAMES.get(cls)
    if names is None:  # ``fields()`` costs more than the copy: once per class
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(task))
    new = object.__new__(cls)
    for name in names:
        object.__setattr__(new, name, changes[name] if name in changes else getattr(task, name))
    return new


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def validate_options(task: Task) -> None:
    """InvalidTask when a DispatchTask's own options are wrong (Django checks the rest)."""
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
        raise InvalidTask(f"timeout must be a positive number of seconds, got {task.timeout!r}.")
    if task.backoff is not None and not callable(task.backoff):
        raise InvalidTask(
            "backoff must be a function (exception, task_result) -> seconds or None, "
            f"got {task.backoff!r}."
        )
    _check_atomic(task)
    if task.resources != AUTO:
        check_needs(task.resources)  # InvalidTask saying what is wrong
    check_locality(task.locality)
    check_concurrency(task)
    for name in ("partition_key", "idempotency_key", "concurrency_key"):
        value = getattr(task, name)
        if value is not None and (
            not isinstance(value, str) or not value or len(value) > KEY_MAX_LENGTH
        ):
            raise InvalidTask(
                f"{name} must be a non-empty string of at most {KEY_MAX_LENGTH} "
                f"characters, got {value!r}."
            )


def _check_atomic(task: DispatchTask[Any, Any]) -> None:
    if not isinstance(task.atomic, bool):
        raise InvalidTask(f"atomic must be True or False, got {task.atomic!r}.")
    if task.atomic and inspect.iscoroutinefunction(task.func):
        # The body would run on an event loop whose queries go through another
        # thread's connection: not the transaction the success is written in.
        raise InvalidTask(
            f"{task.module_path} is an async def with atomic=True: atomic tasks must be "
            "plain (sync) functions, because their writes and the job's success commit "
            "in one transaction on the job thread's connection. Make it a def, or drop "
            "atomic=True."
        )


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
    # Rows without per-job keys or a deferral (most of a busy queue) share one
    # rebuilt Task per (task, options): Tasks are frozen, and rebuilding one
    # per job was a measurable share of a no-op job's CPU. The entry
    # holds the imported object itself, so a task replaced at its path (a
    # reload, a test) is rebuilt, never served stale.
    shared = (
        row["deferred_until"] is None
        and row.get("partition_key") is None
        and row.get("idempotency_key") is None
    )
    if shared:
        key = (path, row["priority"], row["queue_name"], row["backend"], row.get("concurrency_key"))
        hit = _REBUILT.get(key)
        if hit is not None and hit[0] is task:
            return hit[1]
    changes: dict[str, Any] = {
        "priority": row["priority"],
        "queue_name": row["queue_name"],
        "run_after": row["deferred_until"],
        "backend": row["backend"] or task.backend,  # None: the task's own backend
    }
    if isinstance(task, DispatchTask):
        changes["partition_key"] = row["partition_key"]
        changes["idempotency_key"] = row["idempotency_key"]
        changes["concurrency_key"] = row.get("concurrency_key") or None
    rebuilt = _replace(task, validate=False, **changes)
    if shared:
        if len(_REBUILT) >= _CACHE_MAX:  # many distinct options: start over
            _REBUILT.clear()
        _REBUILT[key] = (task, rebuilt)
    return rebuilt


#: ``task_for_row``'s shared Tasks: options -> (imported task, rebuilt Task).
#: Filled by job threads concurrently: each step is one dict operation, and a
#: lost race only rebuilds a Task twice.
_REBUILT: dict[tuple[Any, ...], tuple[Task, Task]] = {}
#: Entries ``_REBUILT`` and ``_BOUND`` each hold before they start over.
_CACHE_MAX = 512


def timeout_of(task: Task | None) -> float | None:
    """The task's ``timeout`` in seconds, None without one (a plain Task, or no task)."""
    timeout = getattr(task, "timeout", None)
    return None if timeout is None else float(timeout)


@functools.lru_cache(maxsize=1024)
def _signature(func: Any) -> inspect.Signature:
    return inspect.signature(func)


def check_arguments(task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Raise InvalidTask when the task function cannot accept these arguments.

    Whether a call binds depends on how many positional arguments it has and
    which keywords, never on their values: a shape that bound once is
    remembered (``_BOUND``), since the worker checks every job before it runs.
    """
    # Only a well-formed call is remembered: a hand-written row's kwargs may
    # be null or a list, which must keep failing the bind below.
    well_formed = isinstance(args, list | tuple) and isinstance(kwargs, dict)
    shape = (task.func, task.takes_context, len(args), tuple(kwargs)) if well_formed else None
    if shape is not None and shape in _BOUND:
        return
    signature = _signature(task.func)
    call_args = (None, *args) if task.takes_context else tuple(args)
    try:
        signature.bind(*call_args, **kwargs)
    except TypeError as e:
        shown = (list(args), dict(kwargs)) if well_formed else (args, kwargs)
        raise InvalidTaskArguments(
            f"{task.module_path}{signature} cannot be called with args={shown[0]!r} "
            f"kwargs={shown[1]!r}: {e}."
        ) from e
    if shape is not None:
        if len(_BOUND) >= _CACHE_MAX:
            _BOUND.clear()
        _BOUND.add(shape)


#: Call shapes (function, takes_context, positional count, keyword names) that bound.
_BOUND: set[tuple[Any, ...]] = set()


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def plain_arity(task: Task) -> int | None:
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
