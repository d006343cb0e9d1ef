"""Operator and application commands, each checking the state it acts on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.tasks import Task, TaskResult
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued

from . import store
from .backend import DispatchBackend, result_from_job, send_robust


def cancel(result_id: str | int) -> bool:
    """Cancel a pending or running job. True only when this call made the change.

    A pending job will never start. A running job is marked cancelled at once;
    its worker notices at its next heartbeat or ``context.progress()`` and
    discards the attempt's result. Unknown or finished jobs: False, no change.
    """
    try:
        job_id = int(result_id)
    except (TypeError, ValueError):
        return False
    return store.job_cancel(job_id)


def enqueue_many(
    task: Task, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
) -> list[TaskResult]:
    """Enqueue many calls of one task in one INSERT (chunked when very large).

    Every call is validated before anything is written: one bad call rejects
    the whole batch with an error naming its index. Returns TaskResults in
    input order.
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
    jobs = []
    for index, call in enumerate(calls):
        try:
            args, kwargs = call
        except (TypeError, ValueError) as e:
            raise InvalidTask(f"call #{index} must be a pair (args, kwargs): {e}") from e
        try:
            jobs.append(backend.build_job(task, args, kwargs))
        except InvalidTask as e:
            raise type(e)(f"call #{index}: {e}") from e
    if not jobs:
        return []
    db = store.db_alias()
    store.jobs_insert(jobs, db=db)
    results = [result_from_job(job, task=task) for job in jobs]
    for result in results:
        send_robust(task_enqueued, backend, result)
    return results
