"""Jobs whose needs no live worker could hold: a read for operators.

Not an enqueue error (workers come and go): ``dispatch_status`` warns and
the admin flags them.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count
from django.db.models.functions import Now

from ..core.resources import Needs, fits
from ..core.states import JobState
from ..models import Job, Worker
from .sources.shapes import pending_shapes


def unplaceable(db: str, namespace: str, *, live_within: float) -> list[tuple[Needs, int]]:
    """Needs of pending jobs that no live worker's whole capacity could hold,
    with how many jobs wait with them (``dispatch_status`` warns, the admin
    flags). Not an enqueue error: workers come and go."""
    shapes = pending_shapes(db, namespace)
    if not shapes:
        return []
    seen = Now() - timedelta(seconds=live_within)
    capacities = [
        capacity or {}
        for capacity in Worker.objects.using(db)
        .filter(namespace=namespace, last_seen_at__gte=seen)
        .values_list("capacity", flat=True)
    ]
    stuck = [s for s, needs in shapes.items() if not any(fits(needs, c) for c in capacities)]
    if not stuck:
        return []
    counts = dict(
        Job.objects.using(db)
        .filter(namespace=namespace, state=JobState.PENDING, resource_shape__in=stuck)
        .values_list("resource_shape")
        .annotate(n=Count("id"))
        .values_list("resource_shape", "n")
    )
    return [(shapes[s], counts.get(s, 0)) for s in stuck]
