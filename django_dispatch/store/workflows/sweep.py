"""Maintenance of workflow steps: recover steps whose job ended without finishing them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import F
from django.db.models.functions import Now

from ...models import Job, WorkflowTask
from ...models.workflow import StepState
from ...sql import JSONAppend
from ...states import LIVE, JobState
from ..base import now_plus
from .common import (
    STEP_JOB_LOST_PATH,
    StepJobBuilder,
    db_or_default,
    enqueue_steps,
    error_at,
    locked_run,
    park,
)


def sweep_stale_steps(
    older_than_seconds: float,
    *,
    build_job: StepJobBuilder,
    limit: int = 500,
    db: str | None = None,
    namespace: str = "",
) -> list[int]:
    """Recover ``namespace``'s steps whose job ended without finishing them; return their ids.

    A ``ready`` or ``running`` step with no sign of life for
    ``older_than_seconds`` whose job is no longer live (it failed, was
    cancelled from the jobs admin, or was purged: a job whose worker died is
    still live, and its re-run re-claims the step) had an attempt lost. That
    counts as a failed attempt: the step gets a fresh job at once if attempts
    remain, otherwise it fails and parks its run, so a step that keeps
    killing its workers ends up in front of a person. The old claim is void,
    so a late write from the old attempt is rejected. Safe to run anywhere,
    any number of times: each recovery is fenced on what was read.
    """
    db = db_or_default(db)
    candidates = list(
        WorkflowTask.objects.using(db)
        .filter(
            namespace=namespace,
            state__in=[StepState.READY, StepState.RUNNING],
            heartbeat_at__lt=now_plus(-older_than_seconds),
        )
        .order_by("heartbeat_at")
        .values("id", "run_id", "state", "claim_id", "job_id")[:limit]
    )
    if not candidates:
        return []
    job_ids = [c["job_id"] for c in candidates if c["job_id"]]
    live = set(
        Job.objects.using(db)
        .filter(id__in=job_ids, state__in=list(LIVE))
        .values_list("id", flat=True)
    )
    recovered = []
    for step in candidates:
        if step["job_id"] not in live and _recover(db, step, build_job):
            recovered.append(step["id"])
    return recovered


def _recover(db: str, step: Mapping[str, Any], build_job: StepJobBuilder) -> bool:
    """One candidate's lost attempt, fenced on the state, claim and job read by the sweep."""
    with locked_run(db, run_id=step["run_id"]) as run:
        if run is None:
            return False
        job_state = Job.objects.using(db).filter(id=step["job_id"]).values_list("state", flat=True)
        state = job_state.first()
        if state in LIVE:
            return False
        message = f"step job {step['job_id']} ended ({state or 'deleted'}) before finishing it"
        entry = error_at(db, STEP_JOB_LOST_PATH, message)
        fenced = WorkflowTask.objects.using(db).filter(
            id=step["id"], state=step["state"], claim_id=step["claim_id"], job_id=step["job_id"]
        )
        row = fenced.values("failures", "max_attempts", "generation").first()
        if row is None:
            return False
        gives_up = row["failures"] + 1 >= row["max_attempts"]
        changes: dict[str, Any] = {
            "errors": JSONAppend("errors", entry),
            "failures": F("failures") + 1,
            "claim_id": None,
            "updated_at": Now(),
        }
        if gives_up:
            changes.update(state=StepState.FAILED, finished_at=Now())
        if not fenced.update(**changes):
            return False
        if gives_up:
            park(db, run["id"])
        else:
            enqueue_steps(db, run, [(step["id"], row["generation"])], build_job)
    return True


def step_jobs_retry_now(*, task_path: str, db: str | None = None) -> int:
    """Make step jobs waiting out a backoff due now; return how many (for tests).

    The timer jobs of waiting steps keep their time: a durable sleep or a
    wait's timeout is what the test is about, not a backoff.
    """
    db = db_or_default(db)
    timers = WorkflowTask.objects.using(db).filter(state=StepState.WAITING, job_id__isnull=False)
    return (
        Job.objects.using(db)
        .filter(task_path=task_path, state=JobState.PENDING, run_after__gt=Now())
        .exclude(id__in=timers.values("job_id"))
        .update(run_after=Now())
    )
