"""Step jobs: building one for a step, routed, and making steps ready with theirs.

A step's job goes to the step's own queue and priority when its definition
routes it (``@wf.step(queue_name=..., priority=...)``), else to its run's
queue at the step task's priority; it always runs in its run's namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db.models.functions import Now

from ...core.workflow_states import StepState
from ...models import Job, WorkflowTask
from ..base import now_plus
from ..enqueue import jobs_insert

#: (step_id, generation, queue_name) -> an unsaved step Job.
StepJobBuilder = Callable[[int, int, str], Job]
#: A locked run's fields, as ``common.lock_run`` reads them (``RUN_FIELDS``).
RunRow = Mapping[str, Any]
#: A step's route: (queue_name, priority), either None for the run's default.
Route = tuple[str | None, int | None]

#: What ``enqueue_steps`` writes on a step it makes ready.
READY_FIELDS = ("state", "job_id", "claim_id", "ready_at", "heartbeat_at", "finished_at",
                "updated_at")  # fmt: skip


def routes_of(db: str, step_ids: Sequence[int]) -> dict[int, Route]:
    """Each step's (queue_name, priority) as stored on its row."""
    rows = WorkflowTask.objects.using(db).filter(id__in=step_ids)
    return {i: (q, p) for i, q, p in rows.values_list("id", "queue_name", "priority")}


def step_job(build_job: StepJobBuilder, run: RunRow, step_id: int, generation: int,
             route: Route) -> Job:  # fmt: skip
    """One step job, routed: the step's queue and priority, else its run's queue."""
    queue_name, priority = route
    job = build_job(step_id, generation, queue_name or run["queue_name"])
    job.namespace = run.get("namespace", "")  # a step's job runs in its run's namespace
    if priority is not None:
        job.priority = priority
    return job


def enqueue_steps(
    db: str,
    run: RunRow,
    items: Sequence[tuple[int, int]],
    build_job: StepJobBuilder,
    *,
    delay: float | None = None,
    routes: Mapping[int, Route] | None = None,
) -> None:
    """Make steps ready and insert one job per (step_id, generation), in this transaction.

    ``routes`` gives each step's (queue_name, priority) when the caller
    has them at hand; otherwise they are read from the step rows.
    """
    if not items:
        return
    if routes is None:
        routes = routes_of(db, [step_id for step_id, _ in items])
    jobs = [step_job(build_job, run, i, g, routes.get(i, (None, None))) for i, g in items]
    ready_at = now_plus(delay) if delay else Now()
    if delay:
        for job in jobs:
            job.run_after = now_plus(delay)  # type: ignore[assignment]
    jobs_insert(jobs, db=db)
    ready = [
        WorkflowTask(
            id=step_id,
            state=StepState.READY,
            job_id=job.pk,
            claim_id=None,
            ready_at=ready_at,
            heartbeat_at=Now(),
            finished_at=None,
            updated_at=Now(),
        )
        for (step_id, _), job in zip(items, jobs, strict=True)
    ]
    if len(ready) == 1:  # the common case: one plain UPDATE, no CASE
        step = ready[0]
        WorkflowTask.objects.using(db).filter(id=step.id).update(
            **{f: getattr(step, f) for f in READY_FIELDS}
        )
    else:
        WorkflowTask.objects.using(db).bulk_update(ready, READY_FIELDS, batch_size=500)
