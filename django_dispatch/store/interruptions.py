"""An attempt the database cut short: run the job again without spending an attempt.

When a job's database connection breaks under its task code (a restart, a
failover, a PgBouncer restart), the failure is the infrastructure's, not the
job's. Like a lost worker, it is counted in ``worker_lost_count`` rather than
against ``max_attempts`` (the retry budget subtracts lost workers), so a
site's database restart never dead-letters jobs whose code is fine, while a
job that keeps breaking its own connection is bounded by ``MAX_WORKER_LOST``
(the runtime fails it once that budget is spent).
"""

from __future__ import annotations

from typing import Any

from django.db.models import F

from ..core.states import waiting_state
from .base import db_alias, notify, now_plus
from .leases import _update_then_promote
from .types import Lease


def job_interrupt_if_leased(
    lease: Lease, errors: list[dict[str, Any]], *, retry_in: float, db: str | None = None
) -> bool:
    """running -> scheduled for ``retry_in`` s (pending when 0), one more lost
    worker recorded; fenced.

    Under its key's lock, like every transition that takes a keyed job out
    of ``running`` (see ``partitions``): an older job of the key, demoted
    while this one ran, is promoted back. The epoch bump fences out anything
    the interrupted attempt might still try to write.
    """
    db = db or db_alias()
    won = _update_then_promote(
        lease,
        None,
        db,
        state=waiting_state(retry_in),
        worker_id=None,
        run_after=now_plus(retry_in),
        errors=errors,
        lease_expires_at=None,
        lease_epoch=F("lease_epoch") + 1,
        worker_lost_count=F("worker_lost_count") + 1,
    )
    if won:
        notify(db, lease.namespace)
    return won
