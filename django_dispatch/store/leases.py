"""The worker's single-job writes, each fenced by its lease.

``_leased`` is the fence: the row only while this exact claim still holds
it (id, ``state = 'running'``, worker_id, lease_epoch). Each claim bumps the
epoch, so a worker whose job was cancelled, timed out or reclaimed while it
was paused matches nothing; the write returns False and the worker must drop
what it was about to record. A whole wave of successes is finished at once
by ``finish``, under the same fence.

Every write that takes a keyed job out of ``running`` (or lets go of a
cancelled one) runs under its key's lock and promotes the key's head in the
same transaction (see ``partitions``: the lock is what keeps two such
transitions of one key from both missing each other's change). Unkeyed jobs
take no lock: each of their writes is a single statement, atomic on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections, transaction
from django.db.models import Case, F, Q, QuerySet, Value, When
from django.db.models.functions import Now

from ..core.states import JobState, waiting_state
from ..models import Job
from .base import db_alias, job_sql, notify, now_plus
from .dead_letters import dead_letter_insert
from .partitions import lock_partitions, partitions_promote
from .types import Lease


def _leased(lease: Lease, db: str):
    """The job's row while this claim still holds it: the fence of every worker write."""
    return Job.objects.using(db).filter(
        id=lease.job_id,
        state=JobState.RUNNING,
        worker_id=lease.worker_id,
        lease_epoch=lease.epoch,
    )


def _update_then_promote(
    lease: Lease, partition_key: str | None, db: str | None, **changes: Any
) -> bool:
    """A fenced update of a running job; for a keyed one, under its key's lock,
    followed by the promotion of its key's head if it won.

    The key is ``partition_key`` or, when the caller did not pass it, the one
    the lease carries. Unkeyed: one UPDATE and nothing else.
    """
    db = db or db_alias()
    key = partition_key or lease.partition_key
    if not key:
        return _leased(lease, db).update(**changes) == 1
    with transaction.atomic(using=db):
        lock_partitions(db, [key])
        won = _leased(lease, db).update(**changes) == 1
        if won:
            partitions_promote(db, [key], lease.namespace)
    return won


def job_finish_if_leased(
    lease: Lease, return_value: Any, *, db: str | None = None, partition_key: str | None = None
) -> bool:
    """running -> succeeded, storing the JSON return value."""
    return _update_then_promote(
        lease,
        partition_key,
        db,
        state=JobState.SUCCEEDED,
        return_value=return_value,
        finished_at=Now(),
        lease_expires_at=None,
    )


def job_fail_if_leased(
    lease: Lease,
    errors: list[dict[str, Any]],
    retry_in: float | None,
    *,
    db: str | None = None,
    partition_key: str | None = None,
) -> bool:
    """running -> scheduled for ``retry_in`` seconds (pending when 0), or -> failed
    when None.

    ``errors`` is the job's whole error history including this attempt; the
    worker read the earlier entries in its claim, and the fence guarantees
    nobody else appended since. A job waiting for its retry stays its
    partition's head, so it keeps blocking the jobs behind it; it still
    promotes its key, under the key's lock, in case an older job (committed
    after it was enqueued) was demoted behind it. A job failed for good gets
    its dead letter in the same transaction.
    """
    db = db or db_alias()
    key = partition_key or lease.partition_key
    if retry_in is not None:
        return _update_then_promote(
            lease,
            key,
            db,
            state=waiting_state(retry_in),
            run_after=now_plus(retry_in),
            errors=errors,
            lease_expires_at=None,
        )
    with transaction.atomic(using=db):
        lock_partitions(db, [key])
        won = (
            _leased(lease, db).update(
                state=JobState.FAILED, finished_at=Now(), errors=errors, lease_expires_at=None
            )
            == 1
        )
        if won:
            dead_letter_insert(db, lease.job_id)
            partitions_promote(db, [key], lease.namespace)
    return won


def job_progress_if_leased(
    lease: Lease, checkpoint: Any, *, lease_seconds: float, db: str | None = None
) -> bool:
    """Persist a resume cursor and renew the lease in one fenced write."""
    db = db or db_alias()
    return (
        _leased(lease, db).update(
            checkpoint=checkpoint, lease_expires_at=now_plus(lease_seconds), heartbeat_at=Now()
        )
        == 1
    )


def job_is_leased(lease: Lease, *, db: str | None = None) -> bool:
    """Whether this claim still holds the job: a plain read, no lock, no write.

    What an atomic task's ``progress()`` asks, inside the task's transaction:
    a write or a ``FOR UPDATE`` there would hold the job's row until the body
    commits, blocking the heartbeat's renewals and the reclaim.
    """
    return _leased(lease, db or db_alias()).exists()


def job_final_checkpoint_if_cancelled(
    lease: Lease, checkpoint: Any, *, db: str | None = None
) -> bool:
    """Keep ``checkpoint`` as the last word of a job cancelled while this worker ran it.

    Work done between the last ``progress()`` and the cancel would otherwise
    be lost: the task is told at its next ``progress()``, whose value is
    saved here. Fenced like every write (worker, epoch), and only while the
    worker still holds the cancelled job (``job_ack_cancelled`` not yet run):
    a job reclaimed by another worker, or already let go, takes nothing.
    """
    return _cancelled_still_held(lease, db or db_alias()).update(checkpoint=checkpoint) == 1


def job_release_if_leased(
    lease: Lease,
    *,
    attempts: int,
    worker_ids: list[str],
    db: str | None = None,
    partition_key: str | None = None,
) -> bool:
    """running -> pending without spending an attempt (graceful shutdown).

    ``attempts`` and ``worker_ids`` are the values from before the claim, so
    the hand-back leaves no trace in the retry budget or the attempt history.
    The job stays its partition's head; like a retry, it promotes its key
    (``partition_key``, or the lease's) in case an older job was demoted
    behind it.
    """
    db = db or db_alias()
    released = _update_then_promote(
        lease,
        partition_key,
        db,
        # A job run_now took before it was due goes back to waiting for it.
        state=Case(
            When(run_after__gt=Now(), then=Value(JobState.SCHEDULED.value)),
            default=Value(JobState.PENDING.value),
        ),
        worker_id=None,
        lease_expires_at=None,
        lease_epoch=F("lease_epoch") + 1,
        attempts=attempts,
        worker_ids=worker_ids,
    )
    if released:
        notify(db, lease.namespace)
    return released


def job_ack_cancelled(
    lease: Lease, *, db: str | None = None, partition_key: str | None = None
) -> bool:
    """The worker stopped a job that was cancelled while it ran: let go of it.

    Until this (or the lease's expiry), a cancelled job keeps its partition
    busy, so the next job of the key never overlaps the cancelled code.
    Letting go frees the key: under its lock, its head is promoted.
    """
    db = db or db_alias()
    key = partition_key or lease.partition_key
    with transaction.atomic(using=db):
        lock_partitions(db, [key])
        acked = _cancelled_still_held(lease, db).update(lease_expires_at=None) == 1
        if acked:
            partitions_promote(db, [key], lease.namespace)
    return acked


#: ``jobs_renew_leases`` on PostgreSQL: the fenced renewal (id, epoch, running,
#: this worker), its rows locked in id order first, as the wave's finish locks
#: them (migration 0030). An UPDATE locks in the order its plan reads them (a
#: bitmap scan: the heap's), and two statements locking the same rows in
#: different orders can deadlock. One statement, in autocommit: a worker
#: frozen mid-heartbeat holds no row lock (the rescue skips locked rows).
#: ``statement_timestamp()`` is Django's ``Now()`` there.
_RENEW_PG_SQL = """
UPDATE {job} AS j SET
    lease_expires_at = statement_timestamp() + %(seconds)s * interval '1 second',
    heartbeat_at = statement_timestamp()
FROM (
    SELECT id FROM {job} WHERE id = ANY(%(ids)s) AND state = {running} AND worker_id = %(worker)s
    ORDER BY id FOR UPDATE
) AS l, unnest(%(ids)s::bigint[], %(epochs)s::bigint[]) AS d(id, epoch)
WHERE j.id = l.id AND j.id = d.id AND j.lease_epoch = d.epoch
"""


def jobs_renew_leases(
    leases: Iterable[Lease], *, lease_seconds: float, db: str | None = None
) -> set[int]:
    """Extend every lease still held; return the ids of jobs this worker lost.

    A job is lost when it was cancelled, timed out by this worker's own
    control loop, or reclaimed after this worker missed its heartbeats. One
    UPDATE renews them all; a second query runs only when some were lost.
    """
    leases = list(leases)
    if not leases:
        return set()
    db = db or db_alias()
    connection = connections[db]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                job_sql(connection, _RENEW_PG_SQL),
                {
                    "ids": [lease.job_id for lease in leases],
                    "epochs": [lease.epoch for lease in leases],
                    "worker": leases[0].worker_id,
                    "seconds": lease_seconds,
                },
            )
            renewed = cursor.rowcount
    else:  # one writer at a time: no lock order to keep
        renewed = _fence(leases, db).update(
            lease_expires_at=now_plus(lease_seconds), heartbeat_at=Now()
        )
    if renewed == len(leases):
        return set()
    held = _held(leases)
    still = set(_fence(leases, db, held).values_list("id", flat=True))
    # Cancelled jobs still held by this worker keep their lease (and with it
    # their partition) until the worker lets go: the next job of the key must
    # not start while the cancelled code may still be running.
    Job.objects.using(db).filter(
        held,
        state=JobState.CANCELLED,
        worker_id=leases[0].worker_id,
        lease_expires_at__isnull=False,
    ).update(lease_expires_at=now_plus(lease_seconds))
    return {lease.job_id for lease in leases} - still


def _held(leases: list[Lease]) -> Q:
    """Each lease's job id and epoch, as one Q. Built only where the ORM needs
    it: a term per lease (a thousand, with the asyncio executor) costs far more
    Python than PostgreSQL's renewal, which takes them as arrays."""
    held = Q()
    for lease in leases:
        held |= Q(id=lease.job_id, lease_epoch=lease.epoch)
    return held


def _fence(leases: list[Lease], db: str, held: Q | None = None) -> QuerySet[Job]:
    """The rows ``leases`` hold that are still running under them (``held``: their
    ``_held``, when the caller has it already)."""
    held = _held(leases) if held is None else held
    return Job.objects.using(db).filter(held, state=JobState.RUNNING, worker_id=leases[0].worker_id)


def _cancelled_still_held(lease: Lease, db: str) -> QuerySet[Job]:
    """The job, if it was cancelled while ``lease`` held it and this worker has
    not let go of it yet (its lease still set): the fence of the writes a
    worker may still make to a job cancelled under it."""
    return Job.objects.using(db).filter(
        id=lease.job_id,
        state=JobState.CANCELLED,
        worker_id=lease.worker_id,
        lease_epoch=lease.epoch,
        lease_expires_at__isnull=False,
    )
