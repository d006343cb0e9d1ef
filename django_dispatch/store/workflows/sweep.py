"""Maintenance of workflow steps: recover steps whose job ended without finishing them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import BooleanField, Exists, F, OuterRef, Q
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from ...core.states import LIVE, QUEUED_STATES, JobState
from ...core.workflow_states import RunState, StepState
from ...models import Job, WorkflowRun, WorkflowTask
from ..base import now_plus
from ..sql import JSONAppend
from .common import (
    STEP_JOB_LOST_PATH,
    StepJobBuilder,
    admit_next,
    db_or_default,
    enqueue_steps,
    error_at,
    gather,
    locked_run,
    map_waiting,
    park,
)
from .stepjobs import BATCH_TASK
from .waits import rearm

#: ``state IN ('ready', 'running')`` with the states as literals, as in the
#: condition of the index it reads, ``dispatch_wftask_live``: SQLite matches
#: no partial index to an ``IN`` list of bound parameters, which is what
#: ``state__in`` sends, and read every step of the table instead.
_READY_OR_RUNNING = RawSQL(
    f"state IN ('{StepState.READY.value}', '{StepState.RUNNING.value}')",
    (),
    output_field=BooleanField(),
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

    A ``waiting`` step whose wait has an end is woken by one deferred timer
    job only (see ``waits``). If that job is no longer live (cancelled from
    the jobs admin, failed, purged) when ``wait_until`` has passed, nothing
    else would ever end the wait: the step gets a fresh timer job, due at
    once, and its ids are returned too. No attempt ran, so none is counted.
    A wait with no end (an event with no timeout, a child run) has no timer
    and is not affected: a publish or the child ends it. A ``ctx.map`` step
    with a free slot and a held child gets one admitted (``admit_starved``),
    and its id returned.
    """
    db = db_or_default(db)
    recovered = _recover_timers(db, namespace, build_job, limit)
    recovered += admit_starved(db, namespace, build_job, limit, older_than_seconds)
    recovered += gather_stalled(db, namespace, older_than_seconds, build_job, limit)
    candidates = list(
        WorkflowTask.objects.using(db)
        .filter(
            _READY_OR_RUNNING,
            namespace=namespace,
            heartbeat_at__lt=now_plus(-older_than_seconds),
        )
        .order_by("heartbeat_at")
        .values("id", "run_id", "state", "claim_id", "job_id")[:limit]
    )
    if not candidates:
        return recovered
    job_ids = [c["job_id"] for c in candidates if c["job_id"]]
    live = set(
        Job.objects.using(db)
        .filter(id__in=job_ids, state__in=list(LIVE))
        .values_list("id", flat=True)
    )
    for step in candidates:
        if step["job_id"] not in live and _recover(db, step, build_job):
            recovered.append(step["id"])
    return recovered


def admit_starved(
    db: str, namespace: str, build_job: StepJobBuilder, limit: int, older_than_seconds: float
) -> list[int]:
    """``ctx.map`` steps with a free slot and a held child: admit one each; their ids.

    A success admits the next held child, unless another transaction held
    that child's row at that moment (``common.admit_next``); with no success
    left to come, only this sweep admits it. It reads waiting map steps
    only, and each repair is fenced like the success's: under the parent
    run's lock, on the step still waiting for that set.

    The free slot is read from the counter (``map_started - map_done``
    children running), which a count lost after its child's commit leaves
    one short: with that child's admission also missed, the set would show
    no free slot for ever. A set with held children and no count for
    ``older_than_seconds`` is recounted from its rows first (the children
    that succeeded, as the gather counts them), under the same lock.
    """
    stale = Q(updated_at__lt=now_plus(-older_than_seconds))
    starved = list(
        WorkflowTask.objects.using(db)
        .filter(namespace=namespace, state=StepState.WAITING, map_batch__isnull=False)
        .filter(map_started__lt=F("map_total"))
        .filter(
            Q(map_max_parallel__isnull=True)
            | Q(map_max_parallel__gt=F("map_started") - F("map_done"))
            | stale
        )
        .values("id", "run_id", "map_batch")[:limit]
    )
    admitted = []
    for step in starved:
        batch = str(step["map_batch"])  # not null: the filter above
        with locked_run(db, run_id=step["run_id"]) as run:
            waiting = map_waiting(db, step["id"], batch)
            row = waiting.values("map_started", "map_done", "map_total", "map_max_parallel")
            counts = row.first() if run is not None else None
            if counts is not None and not _has_slot(counts) and waiting.filter(stale).exists():
                counts["map_done"] = (
                    WorkflowRun.objects.using(db)
                    .filter(map_batch=batch, map_counted=True, state=RunState.SUCCEEDED)
                    .count()
                )
                waiting.update(map_done=counts["map_done"], updated_at=Now())
            if counts is None or not _has_slot(counts):
                continue
            total = counts["map_total"] or 0  # set with the set; checked by _has_slot
            if admit_next(db, waiting, batch, counts["map_started"], total, build_job):
                admitted.append(step["id"])
    return admitted


def gather_stalled(
    db: str, namespace: str, older_than_seconds: float, build_job: StepJobBuilder, limit: int
) -> list[int]:
    """``ctx.map`` steps with every child admitted and no count for a while: gather
    each whose children all succeeded; their ids.

    A child is counted on its step with its success (a one-step child on
    PostgreSQL) or just after its success commits (``common.count_map_child``);
    a worker that dies between those two leaves the count one short, and the
    set would wait for ever. "No count for a
    while" is the step's ``updated_at``, which every count sets (not
    ``heartbeat_at``, which is indexed: see ``pgpath._COUNT_SQL``). The children are
    counted here first, with no lock (a set still running is left alone,
    and looked at again ``older_than_seconds`` later); ``gather`` checks
    again under the parent run's lock.
    """
    stalled = list(
        WorkflowTask.objects.using(db)
        .filter(namespace=namespace, state=StepState.WAITING, map_batch__isnull=False)
        .filter(map_started__gte=F("map_total"), updated_at__lt=now_plus(-older_than_seconds))
        .values_list("id", "run_id", "map_batch", "map_total")[:limit]
    )
    gathered = []
    for step_id, run_id, batch, total in stalled:
        batch = str(batch)
        counted = WorkflowRun.objects.using(db).filter(
            map_batch=batch, map_counted=True, state=RunState.SUCCEEDED
        )
        if counted.count() >= (total or 0) and gather(db, step_id, batch, run_id, build_job):
            gathered.append(step_id)
        else:
            map_waiting(db, step_id, batch).update(updated_at=Now())
    return gathered


def _has_slot(counts: Mapping[str, Any]) -> bool:
    bound = counts["map_max_parallel"]
    running = counts["map_started"] - counts["map_done"]
    return counts["map_started"] < counts["map_total"] and (bound is None or running < bound)


def _recover(db: str, step: Mapping[str, Any], build_job: StepJobBuilder) -> bool:
    """One candidate's lost attempt, fenced on the state, claim and job read by the sweep."""
    with locked_run(db, run_id=step["run_id"]) as run:
        if run is None:
            return False
        job = Job.objects.using(db).filter(id=step["job_id"]).values("state", "task_path").first()
        state = job and job["state"]
        if state in LIVE:
            return False
        message = f"step job {step['job_id']} ended ({state or 'deleted'}) before finishing it"
        # A batch's job ended (one child kept killing its workers, or a worker
        # that predates batches failed it): its children's own code is not to
        # blame, so none is charged an attempt; each goes on by a job of its own.
        shared = job is not None and job["task_path"] == BATCH_TASK
        if shared:
            message += "; the step goes on by a job of its own, with no attempt counted"
        entry = error_at(db, STEP_JOB_LOST_PATH, message)
        fenced = WorkflowTask.objects.using(db).filter(
            id=step["id"], state=step["state"], claim_id=step["claim_id"], job_id=step["job_id"]
        )
        row = fenced.values("failures", "max_attempts", "generation").first()
        if row is None:
            return False
        gives_up = not shared and row["failures"] + 1 >= row["max_attempts"]
        changes: dict[str, Any] = {
            "errors": JSONAppend("errors", entry),
            "failures": F("failures") + (0 if shared else 1),
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


def _recover_timers(db: str, namespace: str, build_job: StepJobBuilder, limit: int) -> list[int]:
    """Waits at or past their end whose timer job is not live: re-armed (see ``sweep_stale_steps``).

    Only waits already over are looked at: a lost timer matters from its
    wait's end, and a timer still ahead of it is pending, so live.
    """
    live_timer = Job.objects.using(db).filter(id=OuterRef("job_id"), state__in=list(LIVE))
    lost = list(
        WorkflowTask.objects.using(db)
        .filter(namespace=namespace, state=StepState.WAITING, wait_until__lte=Now())
        .filter(~Exists(live_timer))
        .order_by("wait_until")
        .values("id", "run_id", "job_id")[:limit]
    )
    recovered = []
    for step in lost:
        with locked_run(db, run_id=step["run_id"]) as run:
            if run is None:
                continue
            timer = Job.objects.using(db).filter(id=step["job_id"] or 0, state__in=list(LIVE))
            if timer.exists():
                continue  # made live again since (a retry from the jobs admin)
            if rearm(db, run, step["id"], step["job_id"], build_job):
                recovered.append(step["id"])
    return recovered


def step_jobs_retry_now(*, task_path: str, db: str | None = None) -> int:
    """Make step jobs waiting out a backoff due now; return how many (for tests).

    The timer jobs of waiting steps keep their time: a durable sleep or a
    wait's timeout is what the test is about, not a backoff.
    """
    db = db_or_default(db)
    timers = WorkflowTask.objects.using(db).filter(state=StepState.WAITING, job_id__isnull=False)
    return (
        Job.objects.using(db)
        .filter(task_path=task_path, state__in=QUEUED_STATES, run_after__gt=Now())
        .exclude(id__in=timers.values("job_id"))
        .update(run_after=Now(), state=JobState.PENDING)
    )
