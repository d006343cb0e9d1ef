"""The claim: lease runnable jobs to a worker, in one short transaction.

``claim_candidates`` is THE claim query. ``jobs_claim`` wraps it with the
partition rules (see ``partitions``) and the lease update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Now

from ..models import Job
from ..sql import JSONAppend
from ..states import JobState
from .base import db_alias, take_sqlite_write_lock
from .partitions import lock_blockers, partition_heads

#: At most this many blocked jobs are demoted per claim transaction, which
#: bounds its length; each demotion takes a job out of the claim index for
#: good, so the next claim goes on where this one stopped.
DEMOTE_BUDGET = 1000
#: Rows read per round once demotion has started (the first round reads
#: exactly the free slots, so unpartitioned claims read no extra rows).
DEMOTE_WINDOW = 64


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


def claim_candidates(db: str, queues: Sequence[str], limit: int, exclude: Sequence[int] = ()):
    """THE claim query: runnable jobs in claim order, locked, skipping locked rows.

    Served by the partial index ``dispatch_job_claim`` (pending rows only), so
    its cost does not grow with finished jobs.
    """
    candidates = Job.objects.using(db).filter(state=JobState.PENDING, run_after__lte=Now())
    if queues:
        candidates = candidates.filter(queue_name__in=list(queues))
    if exclude:
        candidates = candidates.exclude(id__in=list(exclude))
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
    given queues (empty: every queue), are eligible, and of a partition only
    its head while nothing else of it runs. Rows locked by another claimer
    are skipped, never waited for, so concurrent workers never take the same
    job. One short transaction, committed before any task code runs.
    """
    db = db or db_alias()
    # savepoint=False: the worker calls this inside its own cycle transaction
    with transaction.atomic(using=db, savepoint=False):
        take_sqlite_write_lock(db)
        chosen: list[dict[str, Any]] = []
        passed: list[int] = []  # looked at, neither claimed nor demoted
        window, demoted_total = limit, 0
        while True:
            # Our own locks are not skipped: exclude what earlier rounds took.
            seen = passed + [r["id"] for r in chosen]
            rows = list(claim_candidates(db, queues, window, exclude=seen))
            runnable, demoted = _sort_out_partitions(db, rows, chosen, passed)
            chosen += runnable[: limit - len(chosen)]
            demoted_total += demoted
            if not demoted or len(chosen) >= limit or demoted_total >= DEMOTE_BUDGET:
                break
            window = max(limit - len(chosen), DEMOTE_WINDOW)
        if not chosen:
            return []
        now: datetime = chosen[0]["db_now"]
        updated = (
            Job.objects.using(db)
            .filter(id__in=[r["id"] for r in chosen], state=JobState.PENDING)
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
        if updated != len(chosen):  # pragma: no cover - the row locks forbid it
            raise transaction.TransactionManagementError(
                f"claim locked {len(chosen)} jobs but updated {updated}; rolled back"
            )
    return [_claimed(row, worker_id, now) for row in chosen]


def _sort_out_partitions(
    db: str, rows: list[dict[str, Any]], chosen: list[dict[str, Any]], passed: list[int]
) -> tuple[list[dict[str, Any]], int]:
    """Split locked candidates into runnable ones and ones to demote.

    Demotes (in this transaction) the keyed candidates that are not their
    partition's runnable head, once their blocker is locked; the others are
    added to ``passed``. Returns (runnable rows, number demoted).
    """
    heads = partition_heads(db, [r["partition_key"] for r in rows if r["partition_key"]])
    taken = {r["partition_key"] for r in chosen if r["partition_key"]}
    runnable, blocked = [], []
    for row in rows:
        key = row["partition_key"]
        if key is None:
            runnable.append(row)
        elif key not in taken and heads[key].runnable(row["id"]):
            runnable.append(row)
            taken.add(key)
        else:
            blocked.append(row)
    if not blocked:
        return runnable, 0
    blockers = {row["id"]: heads[row["partition_key"]].blocker() for row in blocked}
    locked = lock_blockers(db, [b for b in blockers.values() if b is not None])
    demote = [job_id for job_id, blocker in blockers.items() if blocker in locked]
    passed += [job_id for job_id in blockers if job_id not in demote]
    if demote:
        Job.objects.using(db).filter(id__in=demote, state=JobState.PENDING).update(
            state=JobState.BLOCKED
        )
    return runnable, len(demote)


def jobs_due_exist(*, queues: Sequence[str], db: str | None = None) -> bool:
    """Whether any pending job is due now (one probe of the claim index).

    A claim can come back empty while such jobs exist (they wait behind
    their partition's running head), so ``--burst`` asks this before exiting.
    """
    db = db or db_alias()
    due = Job.objects.using(db).filter(state=JobState.PENDING, run_after__lte=Now())
    if queues:
        due = due.filter(queue_name__in=list(queues))
    return due.exists()


def _claimed(row: dict[str, Any], worker_id: str, now: datetime) -> ClaimedJob:
    """The claimed row as it stands after the lease update (no re-read)."""
    del row["db_now"]
    row["lease_epoch"] += 1
    row["attempts"] += 1
    row["started_at"] = row["started_at"] or now
    row["last_attempted_at"] = now
    row["worker_ids"] = [*row["worker_ids"], worker_id]
    lease = Lease(job_id=row["id"], worker_id=worker_id, epoch=row["lease_epoch"])
    return ClaimedJob(lease=lease, row=row, claimed_at=now)
