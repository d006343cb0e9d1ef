"""``run_now``: a run's runnable steps start at once instead of at their time or next poll."""

from __future__ import annotations

from django.db.models.functions import Now

from ...models import Job, WorkflowRun, WorkflowTask
from ...models.workflow import StepState
from ...states import JobState
from ..base import notify
from .common import db_or_default


def workflow_run_due_now(run_id: int, *, db: str | None = None) -> list[int]:
    """Make the jobs of the run's ``ready`` steps due now and wake idle workers.

    A step waiting out a retry backoff starts at once; a ready step already
    due is taken by the next idle worker without a poll (NOTIFY, delivered
    at commit, on PostgreSQL). Waiting steps keep waiting: their timers are
    what they wait for. Returns the jobs' ids (empty: nothing runnable).
    """
    db = db_or_default(db)
    run = WorkflowRun.objects.using(db).filter(id=run_id).values("namespace").first()
    if run is None:
        return []
    ready = WorkflowTask.objects.using(db).filter(
        run_id=run_id, state=StepState.READY, job_id__isnull=False
    )
    ids = list(
        Job.objects.using(db)
        .filter(id__in=ready.values("job_id"), state=JobState.PENDING)
        .values_list("id", flat=True)
    )
    if ids:
        Job.objects.using(db).filter(
            id__in=ids, state=JobState.PENDING, run_after__gt=Now()
        ).update(run_after=Now())
        WorkflowTask.objects.using(db).filter(job_id__in=ids, state=StepState.READY).update(
            ready_at=Now()
        )
        notify(db, run["namespace"])
    return ids
