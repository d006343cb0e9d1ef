"""Operator and application commands, each checking the state it acts on."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from django.tasks import Task, TaskResult
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued

from . import store
from .backend import (
    JSON_DECODER,
    JSON_ENCODER,
    DispatchBackend,
    check_storable_json,
    enqueued_signal_is_silent,
    ready_results,
    send_robust,
    task_for_row,
    to_json,
)
from .conf import get_settings
from .exceptions import AlreadyReplayed
from .models import CronEntry, DeadLetter
from .store.enqueue import CallChunk, jobs_insert_calls


def cancel(result_id: str | int) -> bool:
    """Cancel a pending, blocked or running job. True only when this call made the change.

    A pending job will never start. A running job is marked cancelled at once;
    its worker notices at its next heartbeat or ``context.progress()`` and
    discards the attempt's result. Unknown or finished jobs: False, no change.
    """
    try:
        job_id = int(result_id)
    except (TypeError, ValueError):
        return False
    return store.job_cancel(job_id)


#: Calls per INSERT statement (and per JSON document) in ``enqueue_many``.
ENQUEUE_CHUNK = 10_000
#: A chunk whose JSON is longer than this (characters) is split in two.
ENQUEUE_CHUNK_CHARS = 32 * 1024 * 1024


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
    if not isinstance(backend, DispatchBackend):
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
    ids, enqueued_ats = jobs_insert_calls(plan.spec, chunks, db=store.db_alias())
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
    backend: DispatchBackend, task: Task, calls: Iterable[Any]
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
    backend: DispatchBackend,
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
    text = JSON_ENCODER.encode(pairs)
    check_storable_json(text)
    if len(text) > ENQUEUE_CHUNK_CHARS and len(pairs) > 1:
        middle = len(pairs) // 2
        yield from _encode_chunk(pairs[:middle])
        yield from _encode_chunk(pairs[middle:])
    else:
        yield CallChunk(text, JSON_DECODER.decode(text))


def _dead_letter_task(dead_letter: DeadLetter) -> Task:
    return task_for_row(
        {
            "task_path": dead_letter.task_path,
            "priority": dead_letter.priority,
            "queue_name": dead_letter.queue_name,
            "deferred_until": None,
            "backend": dead_letter.backend,
            "partition_key": dead_letter.partition_key,
            "idempotency_key": None,
        }
    )


def replay(
    dead_letter_id: int,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    replayed_by: str = "",
) -> TaskResult:
    """Enqueue a fresh job for a dead letter; return its TaskResult.

    The new job has the same task, queue, priority and partition key, and the
    original arguments unless corrected ones are given (validated against the
    task's current signature). It starts with fresh attempt counters. The
    claim is one compare-and-set in the same transaction as the insert: of
    two concurrent replays exactly one wins and the other raises
    ``AlreadyReplayed``; if the insert fails, the claim is rolled back and the
    entry can be replayed later. The dead letter records who replayed it,
    when, with which arguments, and the new job's id.
    """
    db = store.db_alias()
    dead_letter = DeadLetter.objects.using(db).filter(id=dead_letter_id).first()
    if dead_letter is None:
        raise DeadLetter.DoesNotExist(f"No dead letter with id {dead_letter_id}.")
    new_args = list(dead_letter.args if args is None else args)
    new_kwargs = dict(dead_letter.kwargs if kwargs is None else kwargs)
    task = _dead_letter_task(dead_letter)
    with transaction.atomic(using=db):
        if not store.dead_letter_claim_replay(
            dead_letter_id,
            replayed_by=replayed_by,
            args=to_json(new_args, "Replay arguments"),
            kwargs=to_json(new_kwargs, "Replay keyword arguments"),
            db=db,
        ):
            raise AlreadyReplayed(
                f"Dead letter {dead_letter_id} was already replayed "
                f"(see its replay history); nothing was enqueued."
            )
        result = task.enqueue(*new_args, **new_kwargs)
        store.dead_letter_set_replay_job(dead_letter_id, int(result.id), db=db)
    return result


def retry_now(result_id: str | int) -> bool:
    """Run a job that waits for a retry now. True if it was waiting.

    A job that failed for good is retried with ``replay()`` of its dead
    letter instead: finished jobs stay finished, replays are new jobs.
    """
    try:
        job_id = int(result_id)
    except (TypeError, ValueError):
        return False
    return store.jobs_retry_now(job_ids=[job_id]) == 1


def purge(*, max_seconds: float = 30.0) -> tuple[int, int]:
    """Delete finished jobs and dead letters past their retention.

    Runs bounded batches until nothing is left or ``max_seconds`` pass.
    Returns (jobs deleted, dead letters deleted).
    """
    cfg = get_settings()
    deadline = time.monotonic() + max_seconds
    jobs = letters = 0
    while time.monotonic() < deadline:
        batch_jobs = store.jobs_purge(cfg.JOB_RETENTION, batch=cfg.PURGE_BATCH)
        batch_letters = store.dead_letters_purge(
            older_than=cfg.DEAD_LETTER_RETENTION, batch=cfg.PURGE_BATCH
        )
        jobs += batch_jobs
        letters += batch_letters
        if batch_jobs < cfg.PURGE_BATCH and batch_letters < cfg.PURGE_BATCH:
            break
    return jobs, letters


def run_cron_entry_now(entry_id: int) -> TaskResult:
    """Enqueue one job of a cron entry now, leaving its schedule untouched."""
    entry = CronEntry.objects.using(store.db_alias()).get(id=entry_id)
    task = cron_task(entry)
    return task.enqueue(*entry.args, **entry.kwargs)


def cron_task(entry: CronEntry, idempotency_key: str | None = None) -> Task:
    """The Task a cron entry runs, with the entry's queue and priority."""
    return task_for_row(
        {
            "task_path": entry.task_path,
            "priority": entry.priority,
            "queue_name": entry.queue_name,
            "deferred_until": None,
            "backend": None,  # the task's own backend
            "partition_key": None,
            "idempotency_key": idempotency_key,
        }
    )


def set_cron_enabled(entry_ids: Sequence[int], enabled: bool) -> int:
    """Enable or disable cron entries; return how many changed.

    Re-enabling schedules from now on: slots missed while disabled do not fire.
    """
    return store.cron_entries_set_enabled(list(entry_ids), enabled)


def delete_cron_entries(entry_ids: Sequence[int]) -> int:
    """Delete cron entries; return how many were deleted.

    Entries still defined in ``DISPATCH["CRON"]`` are left alone (a worker
    start would only create them again): remove them from the settings first,
    which disables them, or disable them in the admin. Jobs an entry already
    enqueued are not touched.
    """
    return store.cron_entries_delete(list(entry_ids), keep_names=get_settings().CRON)


def delete_finished_jobs(job_ids: Sequence[int]) -> int:
    """Delete the finished jobs among ``job_ids``; pending and running ones stay."""
    return store.jobs_delete_finished(job_ids)


def delete_dead_letters(dead_letter_ids: Sequence[int]) -> int:
    return store.dead_letters_delete(dead_letter_ids)
