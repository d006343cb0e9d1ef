"""Transitions not made by a job's own worker: rescue, cancel, retry now.

Rescue and cancel can free a partition; like the worker's own transitions
they take the keys' locks first and promote in the same transaction (see
``partitions``). ``retry_now`` only moves ``run_after`` of pending jobs, which
neither frees nor stalls a key, and takes none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from ..conf import usage_recorded
from ..core.states import LIVE, QUEUED_STATES, JobState
from ..models import Job
from .base import db_alias, error_entry, notify, take_sqlite_write_lock
from .dead_letters import dead_letter_insert
from .partitions import lock_partition_of_job, lock_partitions, partitions_promote
from .sql import JSONAppend
from .usage import usage_record_lost

logger = logging.getLogger("django_dispatch.store")

WORKER_LOST_PATH = "django_dispatch.exceptions.WorkerLost"


#: What the rescue reads of each expired row: its fence (state), what the
#: rescue writes from (the lost count, the worker and lease for the error
#: entry), the key it frees, and what ``report`` and the usage record need.
_RESCUE_FIELDS = (
    "id",
    "state",
    "worker_id",
    "worker_lost_count",
    "lease_expires_at",
    "partition_key",
    "task_path",
    "queue_name",
    "attempts",
    "last_attempted_at",
    "resources",
)


def jobs_rescue_expired(
    *,
    max_worker_lost: int,
    limit: int = 500,
    db: str | None = None,
    report: Callable[[Mapping[str, Any], bool], None] | None = None,
    namespace: str = "",
    held_by: str | None = None,
) -> tuple[list[int], list[int]]:
    """Return ``namespace``'s jobs whose lease expired to the queue; fail the crash-loopers.

    A lease expires only when its worker stopped heartbeating (SIGKILL, OOM,
    a frozen host). Such a lost attempt is recorded as a ``WorkerLost`` error
    and counted in ``worker_lost_count``, not against ``max_attempts``. A job
    that has lost ``max_worker_lost`` workers is probably what kills them, so
    it is failed instead of being handed to the next victim. The epoch bump
    fences out the old worker should it wake up. Cancelled jobs whose worker
    never let go are released too, freeing their partition. Safe to run from
    every worker at once: rows are taken with SKIP LOCKED.

    ``report(row, failed)`` is called after the commit for each job
    returned to the queue or failed (the row has ``id``, ``task_path``,
    ``queue_name``, ``attempts`` and the lost ``worker_id``), instead of
    the log lines written here without it.

    ``held_by``: instead of the expired leases, those of worker ``held_by``,
    expired or not: a worker restarted under the id of a dead incarnation
    takes back its jobs at once (``runtime.takeover``). The caller has made
    sure that incarnation is gone; the rescue is otherwise the same, so its
    attempts are recorded as lost exactly as at their expiry.
    """
    db = db or db_alias()
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        rows = _take_expired(db, namespace, limit, held_by)
        if rows is None:
            return [], []
        rescued = _rescue_rows(db, rows, max_worker_lost, held_by is not None)
        # Each lost attempt's usage record, with the rescue's outcome, in the
        # rescue's transaction: it commits with the rescue or not at all.
        if usage_recorded("worker_lost"):
            usage_record_lost(db, [row for row, _ in rescued], namespace)
        # A requeued job stays its key's head, but an older job may have been
        # demoted behind it (see ``job_fail_if_leased``): promote every key.
        partitions_promote(db, [row["partition_key"] for row in rows], namespace)
        requeued = [row["id"] for row, gave_up in rescued if not gave_up]
        failed = [row["id"] for row, gave_up in rescued if gave_up]
        if requeued:
            notify(db, namespace)
    _report_rescued(rescued, report, max_worker_lost)
    return requeued, failed


def _take_expired(
    db: str, namespace: str, limit: int, held_by: str | None = None
) -> list[dict[str, Any]] | None:
    """Lock the keys, then the rows, of up to ``limit`` expired jobs (with ``held_by``:
    of the jobs that worker holds); None if there are none.

    Every row taken here frees its key or goes back to the queue, so their
    keys are locked first (see ``partitions``): read them without locking
    rows, lock them (waiting, in key order), then lock the rows, skipping
    rows another rescuer took meanwhile (which may leave none).
    """
    # Two index reads, not a scan of the table: the running jobs' partial
    # index ``dispatch_job_lease`` and the still-leased cancelled jobs'
    # ``dispatch_job_part_cancelling``; ``state IN (running, cancelled)``
    # would match neither index and read the whole table.
    expired = Job.objects.using(db).filter(
        Q(state=JobState.RUNNING) | Q(state=JobState.CANCELLED, lease_expires_at__isnull=False),
        namespace=namespace,
    )
    if held_by is None:
        expired = expired.filter(lease_expires_at__lt=Now())
    else:
        expired = expired.filter(worker_id=held_by)
    seen = list(expired.order_by("lease_expires_at").values_list("id", "partition_key")[:limit])
    if not seen:
        return None
    lock_partitions(db, [key for _, key in seen])
    return list(
        expired.filter(id__in=[job_id for job_id, _ in seen])
        .order_by("lease_expires_at")
        .select_for_update(skip_locked=True)
        .values(*_RESCUE_FIELDS)
    )


def _rescue_rows(
    db: str, rows: Sequence[Mapping[str, Any]], max_worker_lost: int, taken_back: bool = False
) -> list[tuple[Mapping[str, Any], bool]]:
    """Release or rescue each locked row; return (row, failed) for the rescued ones.

    A cancelled job only lets go of its lease (and with it its key); it is
    neither requeued nor failed. A running one is requeued, or failed with
    its dead letter, in the same transaction.
    """
    rescued: list[tuple[Mapping[str, Any], bool]] = []
    for row in rows:
        jobs = Job.objects.using(db).filter(id=row["id"], state=row["state"])
        if row["state"] == JobState.CANCELLED:
            jobs.update(lease_expires_at=None)
        elif _rescue(jobs, row, max_worker_lost, taken_back):
            dead_letter_insert(db, row["id"])
            rescued.append((row, True))
        else:
            rescued.append((row, False))
    return rescued


def _report_rescued(
    rescued: Sequence[tuple[Mapping[str, Any], bool]],
    report: Callable[[Mapping[str, Any], bool], None] | None,
    max_worker_lost: int,
) -> None:
    """After the commit: each rescued row to ``report``, or else to the log."""
    if report is not None:
        for entry, gave_up in rescued:
            report(entry, gave_up)
        return
    for entry, gave_up in rescued:
        if not gave_up:
            logger.warning("job %s: its worker was lost; returned to the queue", entry["id"])
    for entry, gave_up in rescued:
        if gave_up:
            logger.error("job %s: failed after losing %s workers", entry["id"], max_worker_lost)


def _rescue(
    jobs: Any, row: Mapping[str, Any], max_worker_lost: int, taken_back: bool = False
) -> bool:
    """Record a lost attempt on one expired (or taken back) running job; True if it
    failed for good."""
    lost = row["worker_lost_count"] + 1
    why = (
        f"worker {row['worker_id']} was restarted under its id; its previous incarnation, "
        "which ran this job, is gone"
        if taken_back
        else f"worker {row['worker_id']} stopped renewing its lease "
        f"(expired {row['lease_expires_at']})"
    )
    error = error_entry(
        WORKER_LOST_PATH,
        why,
        f"{WORKER_LOST_PATH}: worker {row['worker_id']} was lost while running this job "
        f"({lost} of at most {max_worker_lost} lost workers)\n",
    )
    changes: dict[str, Any] = {
        "worker_lost_count": lost,
        "lease_epoch": F("lease_epoch") + 1,
        "lease_expires_at": None,
        "errors": JSONAppend("errors", error),
    }
    gives_up = lost >= max_worker_lost
    if gives_up:
        changes.update(state=JobState.FAILED, finished_at=Now())
    else:
        changes.update(state=JobState.PENDING, worker_id=None, run_after=Now())
    jobs.update(**changes)
    return gives_up


def job_cancel(job_id: int, *, db: str | None = None) -> bool:
    """pending/scheduled/blocked/running -> cancelled. True only if this call made the change.

    A running job is flipped in the database first: no retry or reclaim can
    revive it, and its worker's next fenced write (heartbeat, progress,
    completion) matches nothing, so the worker stops it and drops its result.
    It keeps its lease until the worker lets go (``job_ack_cancelled``) or
    the lease expires, and with it its partition, so the next job of the key
    never overlaps the cancelled code.
    """
    db = db or db_alias()
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        # The key's lock before the row's (see ``partitions``): a cancel can
        # free the key, and must see, and be seen by, its other transitions.
        lock_partition_of_job(db, job_id)
        row = (
            Job.objects.using(db)
            .filter(id=job_id, state__in=list(LIVE))
            .select_for_update()
            .values("state", "partition_key", "namespace")
            .first()
        )
        if row is None:
            return False
        changes: dict[str, Any] = {"state": JobState.CANCELLED, "finished_at": Now()}
        if row["state"] != JobState.RUNNING:
            changes["lease_expires_at"] = None
        Job.objects.using(db).filter(id=job_id).update(**changes)
        if row["state"] != JobState.RUNNING:  # a running one keeps its key until let go
            partitions_promote(db, [row["partition_key"]], row["namespace"])
    return True


def jobs_retry_now(
    *,
    job_ids: Sequence[int] | None = None,
    queues: Sequence[str] = (),
    namespace: str | None = None,
    db: str | None = None,
) -> int:
    """Make jobs that wait for a retry (scheduled, or pending) due now; return how many.

    Only jobs that already ran (``attempts > 0``) are touched: a job deferred
    with ``run_after`` keeps its schedule. ``namespace``: only that
    namespace's (None: every namespace's).
    """
    db = db or db_alias()
    waiting = Job.objects.using(db).filter(state__in=QUEUED_STATES, attempts__gt=0)
    if namespace is not None:
        waiting = waiting.filter(namespace=namespace)
    if job_ids is not None:
        waiting = waiting.filter(id__in=list(job_ids))
    if queues:
        waiting = waiting.filter(queue_name__in=list(queues))
    namespaces = {namespace} if namespace is not None else set()
    if job_ids:
        namespaces = set(waiting.values_list("namespace", flat=True).distinct())
    changed = waiting.update(run_after=Now(), state=JobState.PENDING)
    if changed:
        for woken in namespaces or {""}:
            notify(db, woken)
    return changed
