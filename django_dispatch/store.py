"""The only writer of job, lease and worker state.

Every function here is one state transition: one statement, or one short
transaction that commits before it returns. None of them holds a lock or a
transaction while task code runs.

Writes made on behalf of a worker take its ``Lease`` and are *fenced*: they
match only ``state = 'running' AND worker_id = … AND lease_epoch = …``. Each
claim bumps the epoch, so a worker that was paused, partitioned or too slow
(and whose job was reclaimed, cancelled or timed out meanwhile) updates zero
rows and must discard its result. Functions return whether they won.

All times come from the database clock (``Now()``), never from a worker's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Coalesce, Now

from .models import Job, Worker
from .sql import JSONAppend
from .states import LIVE, JobState

logger = logging.getLogger("django_dispatch.store")

NOTIFY_CHANNEL = "django_dispatch"


def db_alias() -> str:
    """The database holding job rows, chosen by the project's routers."""
    return router.db_for_write(Job)


def _now_plus(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def notify(db: str) -> None:
    """Wake idle PostgreSQL workers (delivered when the transaction commits)."""
    connection = connections[db]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])


# --- enqueue ---------------------------------------------------------------


def jobs_insert(jobs: Sequence[Job], *, db: str, batch_size: int = 5000) -> list[Job]:
    """Insert pending jobs in the caller's transaction, if there is one.

    A job inserted inside ``transaction.atomic()`` exists exactly when the
    surrounding data does: a rollback removes it and no worker can see it
    before commit. On PostgreSQL an INSERT trigger sends NOTIFY, which is
    delivered at commit. ``enqueued_at`` and ``run_after`` come back from the
    database through RETURNING.
    """
    for job in jobs:
        job.state = JobState.PENDING
    if len(jobs) == 1:
        jobs[0].save(using=db, force_insert=True)
        return list(jobs)
    return Job.objects.using(db).bulk_create(jobs, batch_size=batch_size)


# --- claim and the worker's fenced writes ------------------------------------


@dataclass(frozen=True, slots=True)
class Lease:
    """The token a claim hands out; every later write by the worker carries it."""

    job_id: int
    worker_id: str
    epoch: int


#: Columns a worker needs to run a job; read in the claim so that running a
#: job costs no further SELECT.
CLAIM_FIELDS = (
    "id",
    "task_path",
    "backend",
    "queue_name",
    "priority",
    "args",
    "kwargs",
    "deferred_until",
    "partition_key",
    "idempotency_key",
    "attempts",
    "max_attempts",
    "worker_lost_count",
    "lease_epoch",
    "checkpoint",
    "errors",
    "worker_ids",
    "enqueued_at",
    "started_at",
)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job as it stands right after this worker's claim committed."""

    lease: Lease
    row: dict[str, Any]  # CLAIM_FIELDS, with the claim's own updates applied
    claimed_at: datetime  # database clock

    @property
    def id(self) -> int:
        return self.lease.job_id


def _take_sqlite_write_lock(db: str) -> None:
    """Start the claim's SQLite transaction as a writer.

    SQLite has no row locks; a deferred transaction that read, then tries to
    write, fails if another writer got in between. Writing first (a no-op
    UPDATE) takes the database's write lock up front, waiting up to the
    connection's timeout, so claims are serialized instead of failing.
    """
    Job.objects.using(db).filter(pk=0).update(lease_epoch=0)


def claim_candidates(db: str, queues: Sequence[str], limit: int):
    """THE claim query: runnable jobs in claim order, locked, skipping locked rows.

    Served by the partial index ``dispatch_job_claim`` (pending rows only), so
    its cost does not grow with finished jobs.
    """
    candidates = Job.objects.using(db).filter(state=JobState.PENDING, run_after__lte=Now())
    if queues:
        candidates = candidates.filter(queue_name__in=list(queues))
    return (
        candidates.order_by("-priority", "run_after", "id")
        .select_for_update(skip_locked=True)
        .annotate(db_now=Now())
        .values(*CLAIM_FIELDS, "db_now")[:limit]
    )


def jobs_claim(
    *,
    worker_id: str,
    queues: Sequence[str],
    limit: int,
    lease_seconds: float,
    db: str | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``limit`` runnable jobs to ``worker_id``, in claim order.

    Claim order is priority (high first), then run_after, then id. Only
    pending jobs whose run_after has passed on the database clock, in the
    given queues (empty: every queue), are eligible. Rows locked by another
    claimer are skipped, never waited for, so concurrent workers never take
    the same job. One short transaction: SELECT … FOR UPDATE SKIP LOCKED over
    the partial claim index, then one UPDATE that sets the lease.
    """
    db = db or db_alias()
    with transaction.atomic(using=db):
        if connections[db].vendor == "sqlite":
            _take_sqlite_write_lock(db)
        rows = list(claim_candidates(db, queues, limit))
        if not rows:
            return []
        now: datetime = rows[0]["db_now"]
        updated = (
            Job.objects.using(db)
            .filter(id__in=[r["id"] for r in rows], state=JobState.PENDING)
            .update(
                state=JobState.RUNNING,
                worker_id=worker_id,
                lease_epoch=F("lease_epoch") + 1,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                heartbeat_at=now,
                attempts=F("attempts") + 1,
                started_at=Coalesce(F("started_at"), Value(now)),
                last_attempted_at=now,
                worker_ids=JSONAppend("worker_ids", worker_id),
            )
        )
        if updated != len(rows):  # pragma: no cover - the row locks forbid it
            raise transaction.TransactionManagementError(
                f"claim locked {len(rows)} jobs but updated {updated}; rolled back"
            )
    claimed = []
    for row in rows:
        del row["db_now"]
        row["lease_epoch"] += 1
        row["attempts"] += 1
        row["started_at"] = row["started_at"] or now
        row["last_attempted_at"] = now
        row["worker_ids"] = [*row["worker_ids"], worker_id]
        lease = Lease(job_id=row["id"], worker_id=worker_id, epoch=row["lease_epoch"])
        claimed.append(ClaimedJob(lease=lease, row=row, claimed_at=now))
    return claimed


def _leased(lease: Lease, db: str):
    """The fence: the row only while this exact claim still holds it."""
    return Job.objects.using(db).filter(
        id=lease.job_id,
        state=JobState.RUNNING,
        worker_id=lease.worker_id,
        lease_epoch=lease.epoch,
    )


def job_finish_if_leased(lease: Lease, return_value: Any, *, db: str | None = None) -> bool:
    """running -> succeeded, storing the JSON return value."""
    return (
        _leased(lease, db or db_alias()).update(
            state=JobState.SUCCEEDED,
            return_value=return_value,
            finished_at=Now(),
            lease_expires_at=None,
        )
        == 1
    )


def job_fail_if_leased(
    lease: Lease,
    errors: list[dict[str, Any]],
    retry_in: float | None,
    *,
    db: str | None = None,
) -> bool:
    """running -> pending after ``retry_in`` seconds, or -> failed when None.

    ``errors`` is the job's whole error history including this attempt; the
    worker read the earlier entries in its claim, and the fence guarantees
    nobody else appended since.
    """
    leased = _leased(lease, db or db_alias())
    if retry_in is None:
        changes: dict[str, Any] = {"state": JobState.FAILED, "finished_at": Now()}
    else:
        changes = {"state": JobState.PENDING, "run_after": _now_plus(retry_in)}
    return leased.update(errors=errors, lease_expires_at=None, **changes) == 1


def job_progress_if_leased(
    lease: Lease, checkpoint: Any, *, lease_seconds: float, db: str | None = None
) -> bool:
    """Persist a resume cursor and renew the lease in one fenced write."""
    return (
        _leased(lease, db or db_alias()).update(
            checkpoint=checkpoint,
            lease_expires_at=_now_plus(lease_seconds),
            heartbeat_at=Now(),
        )
        == 1
    )


def job_release_if_leased(
    lease: Lease, *, attempts: int, worker_ids: list[str], db: str | None = None
) -> bool:
    """running -> pending without spending an attempt (graceful shutdown).

    ``attempts`` and ``worker_ids`` are the values from before the claim, so
    the hand-back leaves no trace in the retry budget or the attempt history.
    """
    db = db or db_alias()
    released = (
        _leased(lease, db).update(
            state=JobState.PENDING,
            worker_id=None,
            lease_expires_at=None,
            lease_epoch=F("lease_epoch") + 1,
            attempts=attempts,
            worker_ids=worker_ids,
        )
        == 1
    )
    if released:
        notify(db)
    return released


def jobs_renew_leases(
    leases: Iterable[Lease], *, lease_seconds: float, db: str | None = None
) -> set[int]:
    """Extend every lease still held; return the ids of jobs this worker lost.

    A job is lost when it was cancelled, timed out by this worker's own
    supervisor, or reclaimed after this worker missed its heartbeats. One
    UPDATE renews them all; a second query runs only when some were lost.
    """
    leases = list(leases)
    if not leases:
        return set()
    db = db or db_alias()
    held = Q()
    for lease in leases:
        held |= Q(id=lease.job_id, lease_epoch=lease.epoch)
    fence = Job.objects.using(db).filter(
        held, state=JobState.RUNNING, worker_id=leases[0].worker_id
    )
    renewed = fence.update(lease_expires_at=_now_plus(lease_seconds), heartbeat_at=Now())
    if renewed == len(leases):
        return set()
    still = set(fence.values_list("id", flat=True))
    return {lease.job_id for lease in leases} - still


# --- maintenance and operator transitions ------------------------------------


def error_entry(exception_class_path: str, message: str, traceback: str) -> dict[str, str]:
    """The JSON shape of one attempt's error, as stored in ``Job.errors``."""
    return {
        "exception_class_path": exception_class_path,
        "message": message,
        "traceback": traceback,
    }


WORKER_LOST_PATH = "django_dispatch.exceptions.WorkerLost"


def jobs_rescue_expired(
    *, max_worker_lost: int, limit: int = 500, db: str | None = None
) -> tuple[list[int], list[int]]:
    """Return jobs whose lease expired to the queue; fail the crash-loopers.

    A lease expires only when its worker stopped heartbeating (SIGKILL, OOM,
    a frozen host). Such a lost attempt is recorded as a ``WorkerLost`` error
    and counted in ``worker_lost_count``, not against ``max_attempts``. A job
    that has lost ``max_worker_lost`` workers is probably what kills them, so
    it is failed instead of being handed to the next victim. The epoch bump
    fences out the old worker should it wake up. Safe to run from every
    worker at once: rows are taken with SKIP LOCKED.
    """
    db = db or db_alias()
    requeued: list[int] = []
    failed: list[int] = []
    with transaction.atomic(using=db):
        if connections[db].vendor == "sqlite":
            _take_sqlite_write_lock(db)
        expired = list(
            Job.objects.using(db)
            .filter(state=JobState.RUNNING, lease_expires_at__lt=Now())
            .order_by("lease_expires_at")
            .select_for_update(skip_locked=True)
            .values("id", "worker_id", "worker_lost_count", "lease_expires_at")[:limit]
        )
        for row in expired:
            lost = row["worker_lost_count"] + 1
            error = error_entry(
                WORKER_LOST_PATH,
                f"worker {row['worker_id']} stopped renewing its lease "
                f"(expired {row['lease_expires_at']})",
                f"{WORKER_LOST_PATH}: worker {row['worker_id']} was lost while running "
                f"this job ({lost} of at most {max_worker_lost} lost workers)\n",
            )
            changes: dict[str, Any] = {
                "worker_lost_count": lost,
                "lease_epoch": F("lease_epoch") + 1,
                "lease_expires_at": None,
                "errors": JSONAppend("errors", error),
            }
            if lost >= max_worker_lost:
                changes.update(state=JobState.FAILED, finished_at=Now())
                failed.append(row["id"])
            else:
                changes.update(state=JobState.PENDING, worker_id=None, run_after=Now())
                requeued.append(row["id"])
            Job.objects.using(db).filter(id=row["id"], state=JobState.RUNNING).update(**changes)
        if requeued:
            notify(db)
    for job_id in requeued:
        logger.warning("job %s: its worker was lost; returned to the queue", job_id)
    for job_id in failed:
        logger.error("job %s: failed after losing %s workers", job_id, max_worker_lost)
    return requeued, failed


def job_cancel(job_id: int, *, db: str | None = None) -> bool:
    """pending/running -> cancelled. True only if this call made the change.

    A running job is flipped in the database first: no retry or reclaim can
    revive it, and its worker's next fenced write (heartbeat, progress,
    completion) matches nothing, so the worker stops it and drops its result.
    """
    return (
        Job.objects.using(db or db_alias())
        .filter(id=job_id, state__in=list(LIVE))
        .update(state=JobState.CANCELLED, finished_at=Now(), lease_expires_at=None)
        == 1
    )


def jobs_retry_now(
    *, job_ids: Sequence[int] | None = None, queues: Sequence[str] = (), db: str | None = None
) -> int:
    """Make pending jobs that wait for a retry due now; return how many.

    Only jobs that already ran (``attempts > 0``) are touched: a job deferred
    with ``run_after`` keeps its schedule.
    """
    db = db or db_alias()
    waiting = Job.objects.using(db).filter(state=JobState.PENDING, attempts__gt=0)
    if job_ids is not None:
        waiting = waiting.filter(id__in=list(job_ids))
    if queues:
        waiting = waiting.filter(queue_name__in=list(queues))
    changed = waiting.update(run_after=Now())
    if changed:
        notify(db)
    return changed


# --- workers -----------------------------------------------------------------


def worker_register(
    worker_id: str,
    *,
    hostname: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    db: str | None = None,
) -> None:
    """Create or refresh this worker's row.

    Two single statements rather than ``update_or_create``: on SQLite a
    transaction that reads and then writes fails at once under contention,
    while a lone statement waits for the lock.
    """
    db = db or db_alias()
    fields = {
        "hostname": hostname,
        "pid": pid,
        "queues": list(queues),
        "concurrency": concurrency,
        "running_jobs": 0,
    }
    workers = Worker.objects.using(db)
    if workers.filter(id=worker_id).update(started_at=Now(), last_seen_at=Now(), **fields):
        return
    try:
        workers.create(id=worker_id, **fields)
    except IntegrityError:  # registered concurrently under the same id
        workers.filter(id=worker_id).update(last_seen_at=Now(), **fields)


def worker_touch(worker_id: str, *, running_jobs: int, db: str | None = None) -> None:
    Worker.objects.using(db or db_alias()).filter(id=worker_id).update(
        last_seen_at=Now(), running_jobs=running_jobs
    )


def worker_deregister(worker_id: str, *, db: str | None = None) -> None:
    Worker.objects.using(db or db_alias()).filter(id=worker_id).delete()


def workers_delete_stale(*, stale_seconds: float, db: str | None = None) -> int:
    """Delete Worker rows not seen for ``stale_seconds`` (jobs are untouched)."""
    deleted, _ = (
        Worker.objects.using(db or db_alias())
        .filter(last_seen_at__lt=_now_plus(-stale_seconds))
        .delete()
    )
    return deleted
