"""Dead letters and retention."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from django.db.models import Q
from django.db.models.functions import Now

from ..conf import get_settings
from ..core.states import FINISHED_STATES, QUEUED_STATES, TERMINAL, JobState
from ..models import DeadLetter, Job
from .base import db_alias, notify, now_plus, state_in

#: A purge rests at least this many times as long as its last batch took: on a
#: machine whose cores the workers and the database already use, a purge of
#: batches up to ``PURGE_YIELD_MAX / PURGE_YIELD`` s takes at most a quarter of
#: the time, so the claims keep most of theirs (measured in
#: docs/performance.md "History at scale").
PURGE_YIELD = 3.0
#: The most the duty cycle alone rests after one batch (a batch slowed by a
#: lock or a checkpoint should not stall the purge for minutes).
PURGE_YIELD_MAX = 2.0

#: A cancelled job whose worker has not let go yet still holds its partition:
#: deleting it would let the next job of the key overlap the running code.
_STILL_HELD = Q(state=JobState.CANCELLED, lease_expires_at__isnull=False)


def dead_letter_insert(db: str, job_id: int) -> DeadLetter:
    """Record job ``job_id``, just failed for good, as a dead letter.

    Called inside the transaction that marked the job failed: a failure can
    never exist without its dead letter, nor a dead letter without its failure.
    """
    job = Job.objects.using(db).get(id=job_id)
    last = job.errors[-1] if job.errors else {}
    return DeadLetter.objects.using(db).create(
        job_id=job.pk,
        namespace=job.namespace,
        task_path=job.task_path,
        backend=job.backend,
        queue_name=job.queue_name,
        priority=job.priority,
        args=job.args,
        kwargs=job.kwargs,
        partition_key=job.partition_key,
        errors=job.errors,
        worker_ids=job.worker_ids,
        call_context=job.call_context,
        error_class=last.get("exception_class_path", ""),
        error_message=last.get("message", ""),
        enqueued_at=job.enqueued_at,
    )


def dead_letter_claim_replay(
    dead_letter_id: int,
    *,
    replayed_by: str,
    args: Any,
    kwargs: Any,
    db: str | None = None,
) -> bool:
    """The replay's compare-and-set: True for the one caller that wins.

    Run it in the same transaction as the new job's insert: if the insert
    fails, the rollback releases the claim and the entry can be replayed.
    """
    return (
        DeadLetter.objects.using(db or db_alias())
        .filter(id=dead_letter_id, replayed_at__isnull=True)
        .update(replayed_at=Now(), replayed_by=replayed_by, replay_args=args, replay_kwargs=kwargs)
        == 1
    )


def dead_letter_set_replay_job(dead_letter_id: int, job_id: int, *, db: str | None = None) -> None:
    """Record the replay's job, and keep that job in the dead letter's namespace.

    The replay enqueues through the dead letter's backend alias; should that
    alias have moved to another namespace since, the new (pending, unclaimed:
    same transaction) job is moved back, and its namespace's workers woken.
    """
    db = db or db_alias()
    DeadLetter.objects.using(db).filter(id=dead_letter_id).update(replay_job_id=job_id)
    namespace = (
        DeadLetter.objects.using(db).filter(id=dead_letter_id).values_list("namespace", flat=True)
    ).first()
    if namespace is None:
        return
    moved = (
        Job.objects.using(db)
        .filter(id=job_id, state__in=QUEUED_STATES)
        .exclude(namespace=namespace)
        .update(namespace=namespace)
    )
    if moved:
        notify(db, namespace)


def jobs_purge(
    retention: Mapping[str, float | None],
    *,
    batch: int,
    db: str | None = None,
    namespace: str = "",
) -> int:
    """Delete one batch of ``namespace``'s finished jobs older than their state's retention.

    Bounded (``batch`` rows per state per call) so that no delete holds locks
    for long; the caller repeats until it returns less than a full batch.
    Only terminal rows are touched, through the partial ``dispatch_job_finished``
    index, so the claim path never waits on a purge (``state_in``: its condition,
    which SQLite needs repeated to read it). Safe with several purgers: deleting
    a row twice deletes it once.
    """
    db = db or db_alias()
    deleted = 0
    for state, seconds in retention.items():
        if seconds is None or state not in TERMINAL:
            continue
        old = (
            Job.objects.using(db)
            .filter(
                state_in(FINISHED_STATES),
                namespace=namespace,
                state=state,
                finished_at__lt=now_plus(-seconds),
            )
            .exclude(_STILL_HELD)
            .order_by("finished_at")
            .values_list("id", flat=True)[:batch]
        )
        ids = list(old)
        if ids:
            deleted += Job.objects.using(db).filter(id__in=ids, state=state).delete()[0]
    return deleted


def dead_letters_purge(
    *, older_than: float, batch: int, db: str | None = None, namespace: str = ""
) -> int:
    """Delete one batch of ``namespace``'s dead letters that failed more than
    ``older_than`` s ago."""
    db = db or db_alias()
    ids = list(
        DeadLetter.objects.using(db)
        .filter(namespace=namespace, failed_at__lt=now_plus(-older_than))
        .order_by("failed_at")
        .values_list("id", flat=True)[:batch]
    )
    if not ids:
        return 0
    return DeadLetter.objects.using(db).filter(id__in=ids).delete()[0]


def purge_past_retention(
    job_retention: Mapping[str, float | None],
    *,
    dead_letter_retention: float,
    batch: int,
    max_seconds: float,
    db: str | None = None,
    namespace: str = "",
    pause: float | None = None,
) -> tuple[int, int]:
    """Delete finished jobs and dead letters past their retention; (jobs, dead letters) deleted.

    Not one transaction but a loop of ``jobs_purge`` and ``dead_letters_purge``
    batches, each its own short statement (autocommit: no transaction spans
    two), until both are caught up or ``max_seconds`` pass: a busy site's
    purge keeps up with its finishing rate, and no delete holds locks for long.
    Between two batches it rests: ``pause`` seconds (``DISPATCH["PURGE_PAUSE"]``
    when None), and at least ``PURGE_YIELD`` times what the batch took
    (``purge_rest``). A purge catching up on millions of rows would otherwise
    keep the server busy deleting without a break, and the claims, which
    never wait on its rows' locks, would still wait for its CPU and disk: a
    fixed pause leaves a purge whose batches are slow (a loaded server, a
    cold cache) most of the time; the duty cycle is at most
    ``1 / (PURGE_YIELD + 1)`` of it for batches up to ``PURGE_YIELD_MAX /
    PURGE_YIELD`` s (a slower batch rests ``PURGE_YIELD_MAX``).
    """
    if pause is None:
        pause = get_settings().PURGE_PAUSE
    deadline = time.monotonic() + max_seconds
    jobs = letters = 0
    while True:
        started = time.monotonic()
        batch_jobs = jobs_purge(job_retention, batch=batch, db=db, namespace=namespace)
        batch_letters = dead_letters_purge(
            older_than=dead_letter_retention, batch=batch, db=db, namespace=namespace
        )
        jobs, letters = jobs + batch_jobs, letters + batch_letters
        if batch_jobs < batch and batch_letters < batch:
            break
        ended = time.monotonic()
        rest = purge_rest(ended - started, pause)
        if ended + rest >= deadline:
            break
        time.sleep(rest)
    return jobs, letters


def purge_rest(took: float, pause: float) -> float:
    """Seconds a purge rests after a batch that took ``took`` s: ``pause``, and at
    least ``PURGE_YIELD`` times the batch (at most ``PURGE_YIELD_MAX`` s for that)."""
    return max(pause, min(PURGE_YIELD * took, PURGE_YIELD_MAX))


def jobs_delete_finished(job_ids: Sequence[int], *, db: str | None = None) -> int:
    """Delete the given jobs that are finished; live ones are left alone."""
    return (
        Job.objects.using(db or db_alias())
        .filter(id__in=list(job_ids), state__in=list(TERMINAL))
        .exclude(_STILL_HELD)
        .delete()[0]
    )


def dead_letters_delete(dead_letter_ids: Sequence[int], *, db: str | None = None) -> int:
    return (
        DeadLetter.objects.using(db or db_alias()).filter(id__in=list(dead_letter_ids)).delete()[0]
    )
