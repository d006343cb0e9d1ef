"""``enqueue_many``: many calls of one task, validated together, in one INSERT.

The calls are encoded a chunk at a time (one C-speed pass each), checked
against the task's plan, and inserted by the plan's insert decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from django.db import transaction

from .. import store
from ..compat import InvalidTask, Task, TaskResult, task_enqueued
from ..core.encoding import JSON_DECODER, check_storable_json, dumps
from ..observability import metrics
from ..store.types import CallChunk
from . import call_context
from .registry import DispatchBackendBase
from .results import enqueued_signal_is_silent, ready_result, ready_results, send_robust
from .values import to_json

#: Calls per INSERT statement (and per JSON document) in ``enqueue_many``.
ENQUEUE_CHUNK = 10_000
#: A chunk whose JSON is longer than this (characters) is split in two.
ENQUEUE_CHUNK_CHARS = 32 * 1024 * 1024


Calls = Iterable[tuple[Sequence[Any], Mapping[str, Any]]]


@overload
def enqueue_many(
    task: Task, calls: Calls, *, return_results: Literal[False] = False
) -> list[str]: ...
@overload
def enqueue_many(
    task: Task, calls: Calls, *, return_results: Literal[True]
) -> list[TaskResult]: ...
def enqueue_many(
    task: Task, calls: Calls, *, return_results: bool = False
) -> list[str] | list[TaskResult]:
    """Enqueue many calls of one task in one INSERT (chunked when very large).

    Every call is validated before anything is written: one bad call rejects
    the whole batch with an error naming its index (the first bad one, as if
    the calls were checked one by one). All or nothing, in a transaction of
    its own or a savepoint of the caller's. Returns the new jobs' ids (``TaskResult.id``) in input
    order; with ``return_results=True``, their TaskResults, equal to what
    ``get_result`` returns for them. The ids cost a few dozen bytes a job,
    a TaskResult several hundred (with its own copy of the arguments): a
    million-row batch keeps no TaskResult unless asked to.

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
    signal = not enqueued_signal_is_silent(backend)
    with store.using_backend(backend.alias):  # the task's alias's database
        inserted = _insert_chunks(backend, task, plan, pairs, keep=return_results or signal)
    ids = inserted.ids
    if metrics.AVAILABLE:
        metrics.enqueued(plan.spec.task_path, plan.spec.queue_name, len(ids))
    if return_results:
        results = [
            result
            for chunk_ids, ats, values in inserted.kept
            for result in ready_results(task, chunk_ids, ats, values, backend.alias)
        ]
        if signal:
            for result in results:
                send_robust(task_enqueued, backend, result)
        return results
    if signal:  # one TaskResult at a time, each gone once its receivers return
        for chunk_ids, ats, values in inserted.kept:
            for job_id, enqueued_at, (args, kwargs) in zip(chunk_ids, ats, values, strict=True):
                result = ready_result(task, job_id, enqueued_at, args, kwargs, backend.alias)
                send_robust(task_enqueued, backend, result)
    return ids


@dataclass
class _Inserted:
    """What ``_insert_chunks`` wrote: every id (as the caller gets it), and each
    chunk's ids, timestamps and decoded calls when results or signals need them."""

    ids: list[str] = field(default_factory=list)
    kept: list[tuple[list[int], list[Any], list[Any]]] = field(default_factory=list)


def _insert_chunks(
    backend: DispatchBackendBase, task: Task, plan: Any, pairs: list[Any], *, keep: bool
) -> _Inserted:
    """Encode, check and insert the calls a chunk at a time, in one transaction.

    All or nothing: a bad call in a later chunk rolls the earlier ones back
    (a savepoint inside the caller's transaction). A chunk's JSON and decoded
    calls are dropped once it is inserted unless ``keep``: encoding every
    chunk before the first insert held a million calls' copies at once, about
    400 MB for a million-row batch, where the ids alone are about 60 MB.
    """
    inserted = _Inserted()
    index = 0
    check = plan.check
    context = call_context.for_call(task)  # once for the batch, before anything is written
    chunks = _encode(pairs)
    with transaction.atomic(using=store.db_alias()):
        while True:
            try:
                chunk = next(chunks, None)
            except (TypeError, ValueError):
                _check_in_order(backend, task, pairs)  # raises the first bad call's error
                raise
            if chunk is None:
                return inserted
            for args, kwargs in chunk.values:
                try:
                    check(args, kwargs)
                except InvalidTask as e:
                    raise type(e)(f"call #{index}: {e}") from e
                index += 1
            chunk_ids, enqueued_ats = plan.insert_many([chunk], context)
            inserted.ids += map(str, chunk_ids)
            if keep:
                inserted.kept.append((chunk_ids, enqueued_ats, chunk.values))


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
