"""Retention of finished workflow runs: the leader deletes them in bounded batches.

A run is purged ``WORKFLOW_RETENTION`` seconds after it finished, succeeded
or cancelled (a stuck run waits for a person, whatever its age), with its
steps (foreign-key cascade). Kept: a run with a child still active (its
step is waiting for it) and a child whose parent is still active (the
parent's history points at it).
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef

from ...core.workflow_states import RUN_ACTIVE, RunState
from ...models import WorkflowRun
from ..base import delete_in_batches, now_plus
from .common import db_or_default


def workflow_runs_purge(
    retention: float,
    *,
    batch: int,
    max_seconds: float,
    namespace: str = "",
    db: str | None = None,
) -> int:
    """Delete ``namespace``'s runs finished more than ``retention`` seconds ago; return
    how many runs (steps go with them). Batches until none is left or time is up."""
    db = db_or_default(db)
    runs = WorkflowRun.objects.using(db)
    live_child = runs.filter(parent_run_id=OuterRef("pk"), state__in=list(RUN_ACTIVE))
    live_parent = runs.filter(pk=OuterRef("parent_run_id"), state__in=list(RUN_ACTIVE))
    old = (
        runs.filter(
            namespace=namespace,
            state__in=[RunState.SUCCEEDED, RunState.CANCELLED],
            finished_at__lt=now_plus(-retention),
        )
        .exclude(Exists(live_child))
        .exclude(Exists(live_parent))
    )
    return delete_in_batches(old, "finished_at", batch=batch, max_seconds=max_seconds)
