"""The ORM claim source: due jobs in claim order, one ordered scan.

``runnable_candidates`` is the claim query in the ORM, used on SQLite (under
its write lock) and as the twin that the fused PostgreSQL statement
(``sources.fused_pg``) is tested against: the same rows, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models.functions import Now

from ...core.states import JobState
from ...models import Job
from ..base import CLAIM_ORDER
from ..types import CLAIM_FIELDS


def claim_candidates(
    db: str,
    queues: Sequence[str],
    limit: int,
    exclude: Sequence[int] = (),
    *,
    namespace: str = "",
    paused: Sequence[str] = (),
    priority: int | None = None,
):
    """Runnable jobs of ``namespace`` (of ``priority`` only, if given) in claim
    order, locked, skipping locked rows.

    Served by the partial index ``dispatch_job_claim`` (pending rows only, led
    by the namespace, then the priority), so its cost grows neither with
    finished jobs nor with other namespaces' backlogs; jobs deferred to later
    are ``scheduled``, outside that index, so the ordered scan reads due jobs
    only (``run_after <= now``: a filter for a client's clock running ahead).
    """
    candidates = Job.objects.using(db).filter(
        # Jobs with resource needs: only through the resource pick (sources.resources).
        namespace=namespace,
        state=JobState.PENDING,
        resource_shape__isnull=True,
        run_after__lte=Now(),
    )
    if priority is not None:
        candidates = candidates.filter(priority=priority)
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
    """``claim_candidates`` of every priority: one ordered scan of the claim index.

    Deferred jobs are not in it (``scheduled``, see ``store.staging``), so
    nothing follows a priority's due jobs that the scan would read past; the
    scan stops at ``limit``. ``_CLAIM_SQL`` does the same in one statement
    with the lease (PostgreSQL); this is SQLite's, under its write lock.
    """
    return list(claim_candidates(db, queues, limit, exclude, namespace=namespace, paused=paused))
