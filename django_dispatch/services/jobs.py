"""Commands on jobs, dead letters and cron entries, each checking the state it acts on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction

from .. import store
from ..compat import Task, TaskResult
from ..conf import get_settings
from ..exceptions import AlreadyReplayed
from ..models import CronEntry, DeadLetter
from ..store.dead_letters import purge_past_retention
from ..tasks.registry import DispatchBackendBase, alias_serving
from ..tasks.results import result_from_job
from ..tasks.task import DispatchTask, task_for_row
from ..tasks.values import to_json


def cancel(result_id: str | int, *, backend: str | None = None) -> bool:
    """Cancel a pending, scheduled, blocked or running job. True only when this call
    made the change.

    A pending or scheduled job will never start. A running job is marked cancelled at once;
    its worker notices at its next heartbeat or ``context.progress()`` and
    discards the attempt's result. Unknown or finished jobs: False, no change.
    ``backend``: the TASKS alias whose database holds the job (ids are unique
    within one database only). None: the database of the enclosing
    ``store.using_backend`` block (the admin wraps each request in one), else
    the ``default`` alias's; never the database a ``rundispatch --backend``
    worker serves, which is for its own store calls: a task running in the
    ``eu`` worker that cancels the ``default`` job it enqueued must not reach
    the ``eu`` job with the same id.
    """
    try:
        job_id = int(result_id)
    except (TypeError, ValueError):
        return False
    with store.using_backend(backend):
        return store.job_cancel(job_id)


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
    backend: str | None = None,
) -> TaskResult:
    """Enqueue a fresh job for a dead letter; return its TaskResult.

    The new job has the same task, queue, priority, partition key and call
    context, and the original arguments unless corrected ones are given
    (validated against the task's current signature). A job that had no call
    context gets ``DISPATCH["CALL_CONTEXT"]``'s, as any enqueue does. It
    starts with fresh attempt counters. The claim is one compare-and-set in
    the same transaction as the insert: of two concurrent replays exactly one
    wins and the other raises
    ``AlreadyReplayed``; if the insert fails, the claim is rolled back and the
    entry can be replayed later. The dead letter records who replayed it,
    when, with which arguments, and the new job's id. ``backend``: the TASKS
    alias whose database holds the dead letter (as for ``cancel``).
    """
    with store.using_backend(backend) as db:
        return _replay(dead_letter_id, args, kwargs, replayed_by, db)


def _replay(
    dead_letter_id: int,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    replayed_by: str,
    db: str,
) -> TaskResult:
    dead_letter = DeadLetter.objects.using(db).filter(id=dead_letter_id).first()
    if dead_letter is None:
        raise DeadLetter.DoesNotExist(f"No dead letter with id {dead_letter_id}.")
    new_args = list(dead_letter.args if args is None else args)
    new_kwargs = dict(dead_letter.kwargs if kwargs is None else kwargs)
    task = _dead_letter_task(dead_letter)
    if dead_letter.call_context is not None and isinstance(task, DispatchTask):
        task = task.using(call_context=dead_letter.call_context)  # a replay carries it
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
        result = _enqueue_on(db, task, dead_letter, new_args, new_kwargs)
        store.dead_letter_set_replay_job(dead_letter_id, int(result.id), db=db)
    return result


def _enqueue_on(
    db: str, task: Task, dead_letter: DeadLetter, args: list[Any], kwargs: dict[str, Any]
) -> TaskResult:
    """The replay's job, on the dead letter's database.

    Through the task's backend when that alias keeps its rows there (the
    usual case); else built by it and inserted on ``db``, in the letter's
    namespace: a job a cron entry or a workflow of another alias's database
    ran (its task being the ``default`` alias's) failed there, and its
    replay belongs there too.
    """
    backend = task.get_backend()
    if not isinstance(backend, DispatchBackendBase) or store.database_for(backend.alias) == db:
        return task.enqueue(*args, **kwargs)
    job = backend.build_job(task, args, kwargs)
    job.namespace = dead_letter.namespace
    job.call_context = dead_letter.call_context
    store.jobs_insert([job], db=db)
    return result_from_job(job, task=task)


def retry_now(result_id: str | int, *, backend: str | None = None) -> bool:
    """Run a job that waits for a retry now. True if it was waiting.

    A job that failed for good is retried with ``replay()`` of its dead
    letter instead: finished jobs stay finished, replays are new jobs.
    ``backend``: as for ``cancel``.
    """
    try:
        job_id = int(result_id)
    except (TypeError, ValueError):
        return False
    with store.using_backend(backend):
        return store.jobs_retry_now(job_ids=[job_id]) == 1


def purge(*, max_seconds: float = 30.0, namespace: str = "") -> tuple[int, int]:
    """Delete ``namespace``'s finished jobs and dead letters past their retention.

    Runs bounded batches until nothing is left or ``max_seconds`` pass.
    Returns (jobs deleted, dead letters deleted).
    """
    cfg = get_settings()
    return purge_past_retention(
        cfg.JOB_RETENTION,
        dead_letter_retention=cfg.DEAD_LETTER_RETENTION,
        batch=cfg.PURGE_BATCH,
        max_seconds=max_seconds,
        namespace=namespace,
    )


def run_cron_entry_now(entry_id: int) -> TaskResult:
    """Enqueue one job of a cron entry now, leaving its schedule untouched."""
    db = store.db_alias()
    entry = CronEntry.objects.using(db).get(id=entry_id)
    task = cron_task(entry)
    backend = task.get_backend()
    if not isinstance(backend, DispatchBackendBase) or backend.namespace == entry.namespace:
        return task.enqueue(*entry.args, **entry.kwargs)
    # The entry's namespace, as when the scheduler fires it (``scheduler._enqueue``).
    job = backend.build_job(task, entry.args, entry.kwargs)
    job.namespace = entry.namespace
    job.backend = alias_serving(entry.namespace, job.backend)
    store.jobs_insert([job], db=db)
    return result_from_job(job, task=task)


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
