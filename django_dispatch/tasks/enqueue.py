"""Enqueueing: what one task's enqueues share (``EnqueuePlan``), and ``enqueue_many``.

``DispatchBackendBase`` is the part of our backend that the layers below the
``django.tasks`` adapter use: its options (``MAX_ATTEMPTS``, ``BACKOFF``),
its validation, and the plans it keeps per task. The runtime, the services
and the workflows reach a backend through ``task.get_backend()`` or
``backend_for(alias)`` and call it as one of these; only Django instantiates
its subclass, ``backend.DispatchBackend``, which adds what Django calls
(``enqueue``, ``get_result``, system checks).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from .. import store
from ..compat import BaseTaskBackend, InvalidTask, Task, TaskResult, task_enqueued
from ..conf import size_limit
from ..core.encoding import JSON_DECODER, check_storable_json, dumps, json_text
from ..core.limits import JSONTooLarge, check_size
from ..core.retry import Backoff, exponential_backoff
from ..models import Job
from ..observability import metrics
from ..store.enqueue import CallChunk, JobSpec, jobs_insert_calls
from ..store.flow import jobs_insert_limited
from .options import concurrency_columns
from .placement import is_auto, place
from .results import enqueued_signal_is_silent, ready_results, send_robust
from .task import check_arguments, plain_arity, validate_options
from .values import to_json

#: Tasks whose plan one backend keeps; past that the cache starts over (tasks
#: made per call with ``using(partition_key=...)`` must not grow it forever).
PLAN_CACHE_SIZE = 512
#: Calls per INSERT statement (and per JSON document) in ``enqueue_many``.
ENQUEUE_CHUNK = 10_000
#: A chunk whose JSON is longer than this (characters) is split in two.
ENQUEUE_CHUNK_CHARS = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class EnqueuePlan:
    """What every enqueue of one task on one backend shares, worked out once.

    ``task`` passed ``validate_task``; ``spec`` holds the job columns it
    determines; ``arity`` is ``plain_arity(task)``.
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
            size_limit("MAX_ARGS_BYTES"),
        )
        json_args, json_kwargs = JSON_DECODER.decode(args_text), JSON_DECODER.decode(kwargs_text)
        self.check(json_args, json_kwargs)
        return json_args, json_kwargs, args_text, kwargs_text


class DispatchBackendBase(BaseTaskBackend):
    """A backend's options, validation and enqueue plans (see the module docstring).

    ``__init__`` touches no model and no database: Django builds backends
    lazily, per thread, and may do so before migrations have run.
    """

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.default_max_attempts = self.options.get("MAX_ATTEMPTS", 1)
        #: Every row this backend writes carries it (validated by a system
        #: check, see ``checks.namespace_problem``); ``""``: the default namespace.
        self.namespace: str = self.options.get("NAMESPACE", "")
        backoff = self.options.get("BACKOFF", exponential_backoff)
        self._backoff_setting = backoff
        self._plans: dict[Task, EnqueuePlan] = {}

    @property
    def default_backoff(self) -> Backoff:
        backoff = self._backoff_setting
        return import_string(backoff) if isinstance(backoff, str) else backoff

    def validate_task(self, task: Task) -> None:
        """Django's rules, then ours. Runs at definition and again at enqueue."""
        super().validate_task(task)
        validate_options(task)

    def max_attempts_for(self, task: Task) -> int:
        return getattr(task, "max_attempts", None) or self.default_max_attempts

    def backoff_for(self, task: Task) -> Backoff:
        """The task's backoff (or the default), never retrying a value over a size limit."""
        return functools.partial(
            _no_retry_when_too_large, getattr(task, "backoff", None) or self.default_backoff
        )

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
        cacheable = cacheable and not is_auto(task)  # its needs follow its history (#16)
        plan = EnqueuePlan(
            task=task,
            spec=place(
                JobSpec.of(
                    task_path=task.module_path,
                    namespace=self.namespace,
                    backend=self.alias,
                    queue_name=task.queue_name,
                    priority=task.priority,
                    deferred_until=task.run_after,
                    partition_key=getattr(task, "partition_key", None),
                    idempotency_key=getattr(task, "idempotency_key", None),
                    **concurrency_columns(task),
                    max_attempts=self.max_attempts_for(task),
                ),
                task,
            ),
            arity=plain_arity(task),
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


def dispatch_aliases() -> list[str]:
    """The TASKS aliases whose backend is a DispatchBackend, sorted."""
    from django.conf import settings

    return sorted(alias for alias in getattr(settings, "TASKS", {}) if backend_for(alias))


def namespace_for(alias: str) -> str:
    """The namespace of the DispatchBackend under TASKS alias ``alias``.

    For the functions that create rows from an alias (``Workflow.start``,
    cron entries, ``rundispatch --backend``). An alias that is not a
    DispatchBackend is a ``ValueError`` naming the ones that are: nothing is
    written under a namespace nobody asked for.
    """
    backend = backend_for(alias)
    if backend is None:
        raise ValueError(
            f"TASKS has no DispatchBackend alias {alias!r}; "
            f"DispatchBackend aliases: {dispatch_aliases()}."
        )
    return backend.namespace


def backend_for(alias: str) -> DispatchBackendBase | None:
    """The DispatchBackend configured under ``alias``, or None."""
    from ..compat import task_backends

    try:
        backend = task_backends[alias]
    except Exception:
        return None
    return backend if isinstance(backend, DispatchBackendBase) else None


# --- enqueue_many ------------------------------------------------------------------


def enqueue_many(
    task: Task, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
) -> list[TaskResult]:
    """Enqueue many calls of one task in one INSERT (chunked when very large).

    Every call is validated before anything is written: one bad call rejects
    the whole batch with an error naming its index (the first bad one, as if
    the calls were checked one by one). Runs in the caller's transaction, all
    or nothing. Returns TaskResults in input order, equal to what
    ``get_result`` returns for them.

    The task is validated once, not once per call; the calls are JSON-encoded
    and decoded a chunk at a time (one C-speed pass each), which validates
    them and gives the round-tripped values the worker will see; then each
    decoded call is checked against the function's signature.

    ``task_enqueued`` is sent once per job, as ``Task.enqueue()`` does, except
    when sending would do nothing a user could observe: the only receiver
    connected is Django's own ``log_task_enqueued`` and its logger
    (``django.tasks``) is not enabled for DEBUG, so it would log nothing.
    Skipping those sends is then indistinguishable from making them and saves
    a few percent of a large batch. Connect any receiver, or enable DEBUG on
    ``django.tasks``, and every job's signal is sent.
    """
    backend = task.get_backend()
    if not isinstance(backend, DispatchBackendBase):
        raise InvalidTask(
            f"enqueue_many needs a task on a DispatchBackend; {task.module_path} uses "
            f"{type(backend).__name__}."
        )
    if getattr(task, "idempotency_key", None):
        raise InvalidTask(
            "enqueue_many cannot use an idempotency_key: every call would share it. "
            "Enqueue such calls one by one with task.using(idempotency_key=...).enqueue()."
        )
    pairs = _collect_calls(backend, task, calls)
    if not pairs:
        return []
    with _naming_call(0):
        plan = backend.enqueue_plan(task)
    try:
        chunks = list(_encode(pairs))
    except (TypeError, ValueError):
        _check_in_order(backend, task, pairs)  # raises the first bad call's error
        raise
    index = 0
    check = plan.check
    for chunk in chunks:
        for args, kwargs in chunk.values:
            try:
                check(args, kwargs)
            except InvalidTask as e:
                raise type(e)(f"call #{index}: {e}") from e
            index += 1
    if plan.spec.concurrency_key is None and not plan.spec.partition_yield:
        ids, enqueued_ats = jobs_insert_calls(plan.spec, chunks, db=store.db_alias())
    else:  # through the ORM (#17), leaving the plain raw INSERT as it was
        ids, enqueued_ats = jobs_insert_limited(plan.spec, chunks, db=store.db_alias())
    if metrics.AVAILABLE:
        metrics.enqueued(plan.spec.task_path, plan.spec.queue_name, len(ids))
    results = ready_results(
        task, ids, enqueued_ats, (v for chunk in chunks for v in chunk.values), backend.alias
    )
    if not enqueued_signal_is_silent(backend):
        for result in results:
            send_robust(task_enqueued, backend, result)
    return results


@contextmanager
def _naming_call(index: int) -> Iterator[None]:
    """Prefix an InvalidTask raised inside with the call's index."""
    try:
        yield
    except InvalidTask as e:
        raise type(e)(f"call #{index}: {e}") from e


def _collect_calls(
    backend: DispatchBackendBase, task: Task, calls: Iterable[Any]
) -> list[tuple[Any, Any]]:
    """Each call's (args, kwargs), in the shape ``encode_call`` encodes.

    A list, tuple or dict is kept as is (its JSON is its copy's); anything
    else goes through ``list()``/``dict()`` here, once. If a call is
    malformed, the calls before it are checked first, so that the error is
    the one validating the calls one by one would give.
    """
    pairs: list[tuple[Any, Any]] = []
    for index, call in enumerate(calls):
        try:
            args, kwargs = call
        except (TypeError, ValueError) as e:
            _check_in_order(backend, task, pairs)
            raise InvalidTask(f"call #{index} must be a pair (args, kwargs): {e}") from e
        try:
            if type(args) is not list and type(args) is not tuple:
                args = list(args)
        except Exception:
            _check_in_order(backend, task, pairs, then=index)
            raise
        try:
            if type(kwargs) is not dict:
                kwargs = dict(kwargs)
        except Exception:
            _check_in_order(backend, task, pairs, then=index, then_args=args)
            raise
        pairs.append((args, kwargs))
    return pairs


def _check_in_order(
    backend: DispatchBackendBase,
    task: Task,
    pairs: Sequence[tuple[Any, Any]],
    *,
    then: int | None = None,
    then_args: Any = None,
) -> None:
    """The slow path, taken only once a problem was found: validate the calls
    one by one, as ``Task.enqueue()`` would, and raise the first error.

    ``then``: the index of a call whose args or kwargs could not even be
    turned into a list or dict; its task (and, with ``then_args``, its args)
    are checked as they would have been before that failure.
    """
    for index, (args, kwargs) in enumerate(pairs):
        with _naming_call(index):
            backend.enqueue_plan(task).encode_call(args, kwargs)
    if then is not None:
        with _naming_call(then):
            backend.enqueue_plan(task)
            if then_args is not None:
                to_json(list(then_args), "Task arguments")


def _encode(pairs: list[tuple[Any, Any]]) -> Iterator[CallChunk]:
    """The calls as chunks of JSON (strict, as ``to_json``); TypeError/ValueError if one is not."""
    for start in range(0, len(pairs), ENQUEUE_CHUNK):
        yield from _encode_chunk(pairs[start : start + ENQUEUE_CHUNK])


def _encode_chunk(pairs: list[tuple[Any, Any]]) -> Iterator[CallChunk]:
    text = dumps(pairs)
    check_storable_json(text)
    if len(text) > ENQUEUE_CHUNK_CHARS and len(pairs) > 1:
        middle = len(pairs) // 2
        yield from _encode_chunk(pairs[:middle])
        yield from _encode_chunk(pairs[middle:])
    else:
        yield CallChunk(text, JSON_DECODER.decode(text))
