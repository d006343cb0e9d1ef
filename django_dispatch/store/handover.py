"""Reading back a job this worker (or the process it replaced) still leases.

A worker process that recycles itself (see ``runtime.timeouts``) leaves its
leases to the process that replaces it; that process reads each job back,
through the lease fence, to record the attempt's outcome.
"""

from __future__ import annotations

from .base import db_alias, db_now
from .leases import _leased
from .types import CLAIM_FIELDS, ClaimedJob, Lease


def job_claimed_if_leased(lease: Lease, *, db: str | None = None) -> ClaimedJob | None:
    """The running job as its claim left it, or None once the lease no longer holds it."""
    db = db or db_alias()
    row = (
        _leased(lease, db)  # the same fence as every other write of the worker
        .values(*CLAIM_FIELDS, "last_attempted_at")
        .first()
    )
    if row is None:
        return None
    return ClaimedJob(lease=lease, row=row, claimed_at=row["last_attempted_at"] or db_now(db))
