"""The ORM claim source: due jobs in claim order, one priority at a time.

``runnable_candidates`` is the claim query in the ORM, used on SQLite (under
its write lock) and as the twin that the fused PostgreSQL statement
(``sources.fused_pg``) is tested against: the same rows, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models.functions import Now

from ...core.states import JobState
from ...models import Job
from ..base import CLAIM_ORDER, pending_priorities
from ..types import CLAIM_FIELDS


def claim_candidates(
    db: str,
    queues: Sequence[str],
    limit: int,
    exclude: Sequence[int] = (),
    *,
    namespace: str = "",
    paused: Sequence[str] = (),
    priority: int,
):
    """Runnable jobs of ``namespace`` and ``priority`` in claim order, locked,
    skipping locked rows: one step of ``runnable_candidates``.

    Served by the partial index ``dispatch_job_claim`` (pending rows only, led
    by the namespace, then the priority), so its cost grows neither with
    finished jobs nor with other namespaces' backlogs, and ``run_after <= now``
    bounds the index range, so deferred jobs are not read.
    """
    candidates = Job.objects.using(db).filter(
        # Jobs with resource needs: only through the resource pick (sources.resources).
        namespace=namespace,
        state=JobState.PENDING,
        resource_shape__isnull=True,
        priority=priority,
        run_after__lte=Now(),
    )
    if queues:
        candidates = candidates.filter(queue_name__in=list(queues))
    if exclude:
        candidates = candidates.exclude(id__in=list(exclude))
    if paused:  # queues left out by a pause (see flow.claimable_queues)
        candidates = candidates.exclude(queue_name__in=list(paused))
    return (
        candidates.order_by(*CLAIM_ORDER)
        .select_for_update(skip_locked=True)
        .annotate(db_now=Now())
        .values(*CLAIM_FIELDS, "db_now")[:limit]
    )


def runnable_candidates(
    db: str,
    queues: Sequence[str],
    limit: int,
    exclude: Sequence[int] = (),
    *,
    namespace: str = "",
    paused: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """``claim_candidates`` in claim order, one priority at a time: a loose index scan.

    Why not one query: in ``dispatch_job_claim`` (namespace, priority, run_after, id)
    each priority's deferred jobs follow its due ones, and nothing in the index
    tells the scan that the rest of a priority is deferred. A claim that finds
    fewer due jobs than it wants (every idle poll) or whose due jobs sit at a
    lower priority would read every deferred job of the namespace: a million
    jobs scheduled for next week, on every poll of every worker. Per priority,
    ``run_after <= now`` is a bound of the index range, so each priority costs
    one descent to find it and reads only due jobs. ``_CLAIM_SQL`` does the
    same in one statement (PostgreSQL); this is SQLite's, under its write lock.
    """
    rows: list[dict[str, Any]] = []
    clock: datetime | None = None  # one claim, one clock: the first row's statement's
    for priority in pending_priorities(db, namespace, None):
        for row in claim_candidates(
            db,
            queues,
            limit - len(rows),
            exclude,
            namespace=namespace,
            paused=paused,
            priority=priority,
        ):
            clock = clock or row["db_now"]
            if row["run_after"] <= clock:  # not due when the claim began: left for the next
                row["db_now"] = clock
                rows.append(row)
        if len(rows) >= limit:
            break
    return rows
