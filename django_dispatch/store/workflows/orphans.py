"""Child runs left running for a parent step that no longer waits for them.

Stopping a step that waits for child runs (its run cancelled or replayed,
the step skipped, or failed by a cancelled sibling of a ``ctx.map`` set)
cancels those children only after its own commit (``runs.stop_steps``): a
child run is locked after its parent is released, never the other way
round, which keeps the lock order of a child's success. A process that dies
in between, or a web request killed while it cancels a set's thousands of
children one by one, leaves them running for a parent that will never use
their outputs. The leader's reclaim finds them here.

A child and its parent step's switch to ``waiting`` commit together, and a
step that stops waiting never waits for the same child or set again (a
restart clears both, a new set has a new id): one read without locks finds
them, and each cancel is fenced on what was read.
"""

from __future__ import annotations

import logging
import time

from django.db.models import Exists, OuterRef, Q

from ...core.workflow_states import RUN_ACTIVE, STEP_LIVE, StepState
from ...models import WorkflowRun, WorkflowTask
from ..base import now_plus
from .common import db_or_default
from .runs import cancel_held, workflow_run_cancel

logger = logging.getLogger("django_dispatch.store")

#: A run's ``generation`` until its first reopen.
FIRST_GENERATION = 1
#: Longest one sweep cancels: it runs on the leader's control loop, whose
#: heartbeat and claims wait meanwhile. The next reclaim goes on.
MAX_SECONDS = 1.0


def cancel_orphaned_children(
    older_than_seconds: float,
    *,
    limit: int = 500,
    max_seconds: float = MAX_SECONDS,
    db: str | None = None,
    namespace: str = "",
) -> list[int]:
    """Cancel ``namespace``'s active child runs whose parent step no longer waits
    for them, and their own children; return their ids.

    A parent step that stopped for good (cancelled, skipped, failed) is left
    ``older_than_seconds`` first: the commit's own cancel, right after it,
    goes first. One restarted (a replay, a retry) is not: it changes with
    its new attempt, and the old children are never its. A child replayed
    by hand since (past its first generation) is left alone: a person asked
    for it to run. Everything within ``max_seconds``; the next sweep goes on.
    """
    db = db_or_default(db)
    waits_for_it = WorkflowTask.objects.using(db).filter(
        Q(child_run_id=OuterRef("pk")) | Q(map_batch=OuterRef("map_batch")),
        pk=OuterRef("parent_task_id"),
        state=StepState.WAITING,
    )
    settled = Q(parent_task__updated_at__lt=now_plus(-older_than_seconds))
    active = WorkflowRun.objects.using(db).filter(
        namespace=namespace, state__in=list(RUN_ACTIVE), generation=FIRST_GENERATION
    )
    orphans = list(
        active.filter(settled | Q(parent_task__state__in=list(STEP_LIVE)))
        .exclude(Exists(waits_for_it))
        .values_list("id", "map_batch")[:limit]
    )
    deadline = time.monotonic() + max_seconds
    cancelled: set[int] = set()
    while orphans and time.monotonic() <= deadline:
        parents = _cancel(db, orphans, deadline, cancelled)
        # Their own children: every step of theirs was just cancelled here, so
        # no other cancel is coming for them, and none waits.
        below = active.filter(parent_run_id__in=sorted(parents))
        orphans = list(below.values_list("id", "map_batch")[:limit]) if parents else []
    if cancelled:
        logger.warning(
            "cancelled %s child run(s) whose parent step no longer waits for them "
            "(left running by the process that stopped the step, or still being "
            "cancelled by it): %s",
            len(cancelled),
            sorted(cancelled)[:20],
        )
    return sorted(cancelled)


def _cancel(
    db: str, orphans: list[tuple[int, str | None]], deadline: float, cancelled: set[int]
) -> set[int]:
    """Cancel ``orphans`` until ``deadline``, adding to ``cancelled``; return the
    ones cancelled one by one (the others, held, never started a child).

    A ``ctx.map`` set's held children go together in one transaction; the
    others one by one, fenced on the generation read, each without the
    after-commit cancel of its own children (unbounded), which the caller
    takes instead, within its time."""
    for batch in sorted({batch for _, batch in orphans if batch}):
        if time.monotonic() > deadline:
            return set()
        cancelled.update(cancel_held(db, batch))
    one_by_one = set()
    for run_id, _ in sorted(orphans):
        if time.monotonic() > deadline:
            break
        if run_id not in cancelled and workflow_run_cancel(
            run_id, db=db, generation=FIRST_GENERATION, children=False
        ):
            cancelled.add(run_id)
            one_by_one.add(run_id)
    return one_by_one
