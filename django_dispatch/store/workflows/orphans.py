"""Child runs left running for a parent step that no longer waits for them.

Stopping a step that waits for child runs (its run cancelled or replayed,
the step skipped, or failed by a cancelled sibling of a ``ctx.map`` set)
cancels those children only after its own commit (``runs.stop_steps``): a
child run is locked after its parent is released, never the other way
round, which keeps the lock order of a child's success. A process that dies
in between, or a web request killed while it cancels a set's thousands of
children one by one, leaves them running for a parent that will never use
their outputs. The leader's reclaim finds them here.
"""

from __future__ import annotations

import time

from django.db.models import Exists, OuterRef, Q

from ...core.workflow_states import RUN_ACTIVE, StepState
from ...models import WorkflowRun, WorkflowTask
from ..base import now_plus
from .common import db_or_default
from .runs import cancel_held, workflow_run_cancel

#: A run's ``generation`` until its first reopen.
FIRST_GENERATION = 1
#: Longest one sweep cancels children one by one: it runs on the leader's
#: control loop, which claims nothing meanwhile. The next reclaim goes on.
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
    for them and has not changed for ``older_than_seconds``; return their ids.

    The parent step's ``updated_at`` is what has not changed: the commit's
    own cancel, right after it, is left its time first. A child replayed by
    hand (past its first generation) is left alone: a person asked for it to
    run, whatever its parent does. A ``ctx.map`` set's held children (never
    admitted) go together in one transaction; the others one by one, each
    with its steps, jobs and own children, for ``max_seconds`` at most.
    """
    db = db_or_default(db)
    waits_for_it = WorkflowTask.objects.using(db).filter(
        Q(child_run_id=OuterRef("pk")) | Q(map_batch=OuterRef("map_batch")),
        pk=OuterRef("parent_task_id"),
        state=StepState.WAITING,
    )
    orphans = list(
        WorkflowRun.objects.using(db)
        .filter(
            namespace=namespace,
            state__in=list(RUN_ACTIVE),
            generation=FIRST_GENERATION,
            parent_task__updated_at__lt=now_plus(-older_than_seconds),
        )
        .exclude(Exists(waits_for_it))
        .order_by("id")
        .values_list("id", "map_batch")[:limit]
    )
    deadline = time.monotonic() + max_seconds
    cancelled = set()
    for batch in sorted({batch for _, batch in orphans if batch}):
        cancelled.update(cancel_held(db, batch))
    for run_id, _ in orphans:
        if time.monotonic() > deadline:
            break
        if run_id not in cancelled and workflow_run_cancel(run_id, db=db):
            cancelled.add(run_id)
    return sorted(cancelled)
