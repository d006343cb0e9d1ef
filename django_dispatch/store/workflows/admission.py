"""Admitting a held ``ctx.map`` child: its first steps get their jobs.

Called with the parent run locked (by a sibling's success, or by the sweep
for a set with a free slot and no success left to come), so it takes the
child's row with SKIP LOCKED (see ``_admit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import QuerySet
from django.db.models.functions import Now

from ...core.workflow_states import RunState, StepState
from ...exceptions import ActionNotAllowed
from ...models import WorkflowRun, WorkflowTask
from .stepjobs import StepJobBuilder, enqueue_steps

#: What a held child's jobs need of its run.
HELD_FIELDS = ("id", "state", "queue_name", "namespace")


def admit_next(
    db: str,
    waiting: QuerySet[WorkflowTask],
    batch: str,
    started: int,
    total: int,
    build_job: StepJobBuilder,
) -> bool:
    """Admit the set's next held child (parent run locked); True if one was.

    Children no longer held are passed over; one another transaction holds
    is left for the next success, or for the sweep (``admit_starved``).
    """
    admitted = started
    outcome = "gone"
    while admitted < total and outcome == "gone":
        outcome = _admit(db, batch, admitted, build_job)
        if outcome != "busy":
            admitted += 1
    if admitted != started:
        waiting.update(map_started=admitted)
    return outcome == "admitted"


def _admit(db: str, batch: str, index: int, build_job: StepJobBuilder) -> str:
    """Make the held child at ``index`` runnable: its first steps get their jobs.

    Called with the parent run locked, so it takes the child's row with SKIP
    LOCKED: a transaction holding it (an operator cancelling the child, or
    skipping one of its steps) may be waiting for the parent, and waiting
    for it here would close a circle. Returns ``admitted``, ``busy`` (held
    by such a transaction: try again at the next success, or the sweep's)
    or ``gone`` (no longer held: cancelled, or started by an operator; the
    next one's turn).
    """
    held = WorkflowRun.objects.using(db).filter(map_batch=batch, map_index=index)
    row = held.select_for_update(skip_locked=True).values(*HELD_FIELDS).first()
    if row is None:
        return "busy" if held.exists() else "gone"
    if row["state"] != RunState.RUNNING:
        return "gone"
    steps = WorkflowTask.objects.using(db).filter(
        run_id=row["id"], state=StepState.PENDING, job_id__isnull=True
    )
    first = [
        s
        for s in steps.values("id", "generation", "depends_on", "queue_name", "priority")
        if not s["depends_on"]
    ]
    if not first:
        return "gone"
    held.update(updated_at=Now())
    routes = {s["id"]: (s["queue_name"], s["priority"]) for s in first}
    enqueue_steps(db, row, [(s["id"], s["generation"]) for s in first], build_job, routes=routes)
    return "admitted"


def refuse_held_skip(db: str, run: Mapping[str, Any], step_name: str) -> None:
    """Raise ``ActionNotAllowed`` if ``run`` (locked) is a ``ctx.map`` child still
    held: skipping its step would finish it without its turn, and the success
    would admit the next held child while as many as ``max_parallel`` run."""
    if not (run["map_batch"] and run["parent_task_id"]):
        return
    index = WorkflowRun.objects.using(db).filter(id=run["id"]).values_list("map_index", flat=True)
    waiting = WorkflowTask.objects.using(db).filter(
        id=run["parent_task_id"], state=StepState.WAITING, map_batch=run["map_batch"]
    )
    if waiting.filter(map_started__lte=index[:1]).exists():
        raise ActionNotAllowed(
            f"step {step_name!r} of run {run['id']} was not skipped: the run is a ctx.map "
            "child still held back by its set's max_parallel, and finishing it now would "
            "let one child more than max_parallel run. Skip it once the child is admitted "
            "(as the children before it finish), or skip the mapping step of run "
            f"{run['parent_run_id']}."
        )
