"""Reading back a job this worker (or the process it replaced) still leases.

A worker process that recycles itself (see ``runtime.timeouts``) leaves its
leases to the process that replaces it; that process reads each job back,
through the lease fence, to record the attempt's outcome.
"""

from __future__ import annotations

from ..models import Job
from ..states import JobState
from .base import db_alias, db_now
from .claim import CLAIM_FIELDS, ClaimedJob, Lease


def job_claimed_if_leased(lease: Lease, *, db: str | None = None) -> ClaimedJob | None:
    """The running job as its claim left it, or None once the lease no longer holds it."""
    db = db or db_alias()
    row = (
        Job.objects.using(db)
        .filter(
            id=lease.job_id,
            state=JobState.RUNNING,
            worker_id=lease.worker_id,
            lease_epoch=lease.epoch,
        )
        .values(*CLAIM_FIELDS, "last_attempted_at")
        .first()
    )
    if row is None:
        return None
    return ClaimedJob(lease=lease, row=row, claimed_at=row["last_attempted_at"] or db_now(db))
