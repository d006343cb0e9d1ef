"""Step jobs: building one for a step, routed, and making steps ready with theirs.

A step's job goes to the step's own queue and priority when its definition
routes it (``@wf.step(queue_name=..., priority=...)``), else to its run's
queue at the step task's priority; it always runs in its run's namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db.models import F
from django.db.models.functions import Now

from ...core.states import waiting_state
from ...core.workflow_states import StepState
from ...models import Job, WorkflowTask
from ..base import now_plus
from ..enqueue import jobs_insert

#: (step_id, generation, queue_name, namespace) -> an unsaved step Job of that
#: namespace, recorded under an alias serving it.
StepJobBuilder = Callable[[int, int, str, str], Job]
#: A locked run's fields, as ``common.lock_run`` reads them (``RUN_FIELDS``).
RunRow = Mapping[str, Any]
#: A step's route: (queue_name, priority), either None for the run's default.
Route = tuple[str | None, int | None]

#: The task of a ``ctx.map`` batch's job (``mapbatch``;
#: ``workflows.tasks.run_steps``): its one argument is a list of
#: ``[step_id, generation]`` pairs, each step entrusted to it.
BATCH_TASK = "django_dispatch.workflows.tasks.run_steps"

#: More stretches of consecutive ids than this: the steps' job ids go by CASE.
MAX_STRETCHES = 8
#: Steps per statement when their job ids go by CASE.
LINK_BATCH = 500


def routes_of(db: str, step_ids: Sequence[int]) -> dict[int, Route]:
    """Each step's (queue_name, priority) as stored on its row."""
    rows = WorkflowTask.objects.using(db).filter(id__in=step_ids)
    return {i: (q, p) for i, q, p in rows.values_list("id", "queue_name", "priority")}


def shared(db: str, job_id: int) -> bool:
    """Whether ``job_id`` is a batch's job, which other steps than one need."""
    return Job.objects.using(db).filter(id=job_id, task_path=BATCH_TASK).exists()


def step_job(build_job: StepJobBuilder, run: RunRow, step_id: int, generation: int,
             route: Route) -> Job:  # fmt: skip
    """One step job, routed: the step's queue and priority, else its run's queue."""
    queue_name, priority = route
    # A step's job runs in its run's namespace, whatever alias run_step names.
    job = build_job(step_id, generation, queue_name or run["queue_name"], run.get("namespace", ""))
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
            job.state = waiting_state(delay)  # out of the claim index until due
    jobs_insert(jobs, db=db)
    ready = {
        "state": StepState.READY,
        "claim_id": None,
        "ready_at": ready_at,
        "heartbeat_at": Now(),
        "finished_at": None,
        "updated_at": Now(),
    }
    pairs = [(step_id, job.pk) for (step_id, _), job in zip(items, jobs, strict=True)]
    _link_jobs(db, pairs, ready)


def _link_jobs(db: str, pairs: Sequence[tuple[int, int]], ready: dict[str, Any]) -> None:
    """Write ``ready`` and each step's job id, in few statements however many steps.

    Steps and jobs inserted together (a map's set) mostly have consecutive
    ids on both sides: each such stretch is one UPDATE (``job_id = id +
    offset`` over an id range). Ids interleaved with other inserts fall back
    to one UPDATE for the common fields and a CASE for the job ids, per 500.
    """
    steps = WorkflowTask.objects.using(db)
    stretches = _stretches(pairs)
    if len(stretches) <= MAX_STRETCHES:
        for first, last, offset in stretches:
            steps.filter(id__gte=first, id__lte=last).update(job_id=F("id") + offset, **ready)
        return
    for start in range(0, len(pairs), LINK_BATCH):
        chunk = pairs[start : start + LINK_BATCH]
        steps.filter(id__in=[step_id for step_id, _ in chunk]).update(**ready)
        linked = [WorkflowTask(id=step_id, job_id=job_id) for step_id, job_id in chunk]
        steps.bulk_update(linked, ["job_id"])


def _stretches(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(first step id, last step id, job id - step id) of each run of pairs whose
    step ids and job ids both go up by one."""
    found: list[tuple[int, int, int]] = []
    for step_id, job_id in sorted(pairs):
        if found:
            first, last, offset = found[-1]
            if step_id == last + 1 and job_id - step_id == offset:
                found[-1] = (first, step_id, offset)
                continue
        found.append((step_id, step_id, job_id - step_id))
    return found
