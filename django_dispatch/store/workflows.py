"""The only writer of workflow run and step state.

Each step runs as a job of one internal task (``run_step``). The job first
*claims* its step: a compare-and-set that only the job entrusted with the
step (``job_id``), for the step's current ``generation``, can win; it hands
out a fresh random ``claim_id``. Every later write for that attempt
(checkpoint, output, failure, child run) matches ``id``, ``claim_id`` and
``state = 'running'``, so it changes nothing once the claim is void: the run
was cancelled or reopened, the step skipped or swept, or the job's worker
was lost and the re-run of the job claimed the step anew.

Every transition of a run, and every step transition that may change what
else in the run can go on, runs in one short transaction that first locks
the run row (an UPDATE of ``updated_at``; on SQLite, the database write
lock). So transitions of one run are serialized, and locks are always taken
run first, then its steps, then jobs; a child run's transaction may then lock
its parent run, never the other way round (cascades down to child runs run
after commit), so two transactions cannot deadlock on each other's runs.

Step jobs are built by the caller's ``build_job(task_id, generation,
queue_name) -> Job`` (the workflow engine, which knows the task) and
inserted here, in the same transaction as the step's move to ``ready``.

All times come from the database clock.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Value
from django.db.models.functions import Coalesce, Now

from ..models import Job, WorkflowRun, WorkflowTask
from ..models.workflow import (
    RUN_ACTIVE,
    RUN_REOPENABLE,
    STEP_DONE,
    STEP_LIVE,
    STEP_SKIPPABLE,
    STEP_UNFINISHED,
    RunState,
    StepState,
)
from ..sql import JSONAppend
from ..states import LIVE, JobState
from .base import db_alias, db_now, error_entry, now_plus, take_sqlite_write_lock
from .enqueue import jobs_insert
from .maintenance import job_cancel

#: (workflow_task_id, generation, queue_name) -> an unsaved step Job.
StepJobBuilder = Callable[[int, int, str], Job]

WORKER_LOST_PATH = "django_dispatch.exceptions.WorkerLost"
STEP_JOB_LOST_PATH = "django_dispatch.workflows.exceptions.StepJobLost"
CHILD_CANCELLED_PATH = "django_dispatch.workflows.exceptions.ChildRunCancelled"

_RUN_FIELDS = ("id", "name", "state", "generation", "queue_name", "parent_task_id")


@dataclass(frozen=True, slots=True)
class StepSpec:
    """A step as snapshotted on its row when a run starts."""

    name: str
    handler_path: str
    sequence: int
    depends_on: Sequence[str]
    max_attempts: int
    backoff: float | str | None
    timeout: float | None


@dataclass(frozen=True, slots=True)
class ClaimedStep:
    """A step as it stands right after its job's claim; ``claim_id`` fences writes."""

    task_id: int
    claim_id: str
    run_id: int
    workflow_name: str
    name: str
    handler_path: str
    generation: int
    attempt: int  # attempts started, this one included
    failures: int  # failed attempts so far, counted against max_attempts
    max_attempts: int
    backoff: float | str | None
    timeout: float | None
    checkpoint: Any
    input: Any
    outputs: dict[str, Any]  # every ancestor's output (None when skipped)
    queue_name: str


# --- helpers --------------------------------------------------------------------


def ancestors(depends_on: Mapping[str, Sequence[str]], name: str) -> set[str]:
    """Every step that ``name`` depends on, directly or not."""
    found: set[str] = set()
    todo = list(depends_on.get(name, ()))
    while todo:
        dep = todo.pop()
        if dep not in found:
            found.add(dep)
            todo.extend(depends_on.get(dep, ()))
    return found


def descendants(depends_on: Mapping[str, Sequence[str]], name: str) -> set[str]:
    """Every step that depends on ``name``, directly or not."""
    return {other for other in depends_on if name in ancestors(depends_on, other)}


def _db(db: str | None) -> str:
    return db or db_alias()


def _lock_run(db: str, run_id: int) -> dict[str, Any] | None:
    """Lock (and touch) a run row for this transaction; return its fields."""
    if not WorkflowRun.objects.using(db).filter(id=run_id).update(updated_at=Now()):
        return None
    return WorkflowRun.objects.using(db).filter(id=run_id).values(*_RUN_FIELDS).first()


def _run_id_of(db: str, task_id: int) -> int | None:
    return (
        WorkflowTask.objects.using(db).filter(id=task_id).values_list("run_id", flat=True).first()
    )


def _claimed(db: str, task_id: int, claim_id: str):
    """THE fence: the step while this exact claim still holds it."""
    return WorkflowTask.objects.using(db).filter(
        id=task_id, claim_id=claim_id, state=StepState.RUNNING
    )


def _entry(db: str, path: str, message: str, traceback: str, **extra: Any) -> dict[str, Any]:
    """An error entry stamped with the database clock."""
    return {**error_entry(path, message, traceback), "at": db_now(db).isoformat(), **extra}


def _enqueue(
    db: str,
    run: Mapping[str, Any],
    items: Sequence[tuple[int, int]],
    build_job: StepJobBuilder,
    *,
    delay: float | None = None,
) -> None:
    """Make steps ready and insert one job per step, in the caller's transaction."""
    if not items:
        return
    jobs = [build_job(task_id, generation, run["queue_name"]) for task_id, generation in items]
    ready_at = now_plus(delay) if delay else Now()
    if delay:
        for job in jobs:
            job.run_after = now_plus(delay)  # type: ignore[assignment]
    jobs_insert(jobs, db=db)
    for (task_id, _), job in zip(items, jobs, strict=True):
        WorkflowTask.objects.using(db).filter(id=task_id).update(
            state=StepState.READY,
            job_id=job.pk,
            claim_id=None,
            ready_at=ready_at,
            heartbeat_at=Now(),
            finished_at=None,
            updated_at=Now(),
        )


def _advance(db: str, run: Mapping[str, Any], build_job: StepJobBuilder) -> None:
    """After a step finished or was skipped: start what became runnable, end the run.

    Pending steps whose dependencies are all done get their jobs; a run whose
    steps are all done succeeds (with its last step's output) and, if it is a
    child run, completes the parent's waiting step; a stuck run with no failed
    step left runs again. Called with the run locked.
    """
    steps = list(
        WorkflowTask.objects.using(db)
        .filter(run_id=run["id"])
        .order_by("sequence")
        .values("id", "name", "state", "depends_on", "generation", "output")
    )
    done = {s["name"] for s in steps if s["state"] in STEP_DONE}
    if run["state"] not in RUN_ACTIVE:
        return
    runnable = [
        (s["id"], s["generation"])
        for s in steps
        if s["state"] == StepState.PENDING and all(d in done for d in s["depends_on"])
    ]
    _enqueue(db, run, runnable, build_job)
    runs = WorkflowRun.objects.using(db).filter(id=run["id"])
    if steps and len(done) == len(steps):
        output = steps[-1]["output"]
        runs.update(state=RunState.SUCCEEDED, output=output, finished_at=Now())
        if run["parent_task_id"]:
            _child_succeeded(db, run["id"], run["parent_task_id"], output, build_job)
    elif run["state"] == RunState.STUCK and not any(s["state"] == StepState.FAILED for s in steps):
        runs.update(state=RunState.RUNNING)


def _child_succeeded(
    db: str, child_id: int, parent_task_id: int, output: Any, build_job: StepJobBuilder
) -> None:
    """The parent's waiting step succeeds with the child's output (child run locked)."""
    parent_run_id = _run_id_of(db, parent_task_id)
    parent = _lock_run(db, parent_run_id) if parent_run_id else None
    if parent is None:
        return
    waiting = WorkflowTask.objects.using(db).filter(
        id=parent_task_id, state=StepState.WAITING, child_run_id=child_id
    )
    if waiting.update(
        state=StepState.SUCCEEDED, output=output, finished_at=Now(), updated_at=Now()
    ):
        _advance(db, parent, build_job)


def _child_cancelled(db: str, child_id: int, parent_task_id: int) -> None:
    """The parent's waiting step fails for good, parking its run (child run locked)."""
    parent_run_id = _run_id_of(db, parent_task_id)
    parent = _lock_run(db, parent_run_id) if parent_run_id else None
    if parent is None:
        return
    message = f"child run {child_id} was cancelled"
    entry = _entry(db, CHILD_CANCELLED_PATH, message, f"{CHILD_CANCELLED_PATH}: {message}\n")
    waiting = WorkflowTask.objects.using(db).filter(
        id=parent_task_id, state=StepState.WAITING, child_run_id=child_id
    )
    if waiting.update(
        state=StepState.FAILED,
        errors=JSONAppend("errors", entry),
        failures=F("failures") + 1,
        finished_at=Now(),
        updated_at=Now(),
    ):
        _park(db, parent["id"])


def _park(db: str, run_id: int) -> None:
    WorkflowRun.objects.using(db).filter(id=run_id, state=RunState.RUNNING).update(
        state=RunState.STUCK
    )


def _cancel_children_on_commit(db: str, child_ids: Iterable[int | None]) -> None:
    """Cascade down after commit: a child run is locked only after its parent is released."""
    ids = [c for c in child_ids if c]
    if ids:
        transaction.on_commit(lambda: [workflow_run_cancel(c, db=db) for c in ids], using=db)


# --- start ------------------------------------------------------------------------


def _insert_run(
    db: str,
    *,
    name: str,
    input: Any,
    steps: Sequence[StepSpec],
    queue_name: str,
    idempotency_key: str | None,
    build_job: StepJobBuilder,
    parent_task: tuple[int, int] | None = None,
) -> WorkflowRun:
    run = WorkflowRun(
        name=name,
        state=RunState.RUNNING,
        input=input,
        queue_name=queue_name,
        idempotency_key=idempotency_key,
        parent_run_id=parent_task[0] if parent_task else None,
        parent_task_id=parent_task[1] if parent_task else None,
    )
    run.save(using=db, force_insert=True)
    rows = WorkflowTask.objects.using(db).bulk_create(
        [
            WorkflowTask(
                run=run,
                name=s.name,
                sequence=s.sequence,
                handler_path=s.handler_path,
                depends_on=list(s.depends_on),
                max_attempts=s.max_attempts,
                backoff=s.backoff,
                timeout=s.timeout,
                generation=run.generation,
            )
            for s in steps
        ]
    )
    fields = {"id": run.pk, "queue_name": queue_name}
    _enqueue(db, fields, [(r.pk, r.generation) for r in rows if not r.depends_on], build_job)
    return run


def workflow_run_insert(
    *,
    name: str,
    input: Any,
    steps: Sequence[StepSpec],
    queue_name: str,
    idempotency_key: str | None,
    build_job: StepJobBuilder,
    db: str | None = None,
) -> tuple[WorkflowRun, bool]:
    """Insert a run, all its steps, and the jobs of its first steps; return (run, created).

    One transaction (a savepoint inside the caller's). With an idempotency
    key held by a run of the same workflow, nothing is inserted and that run
    is returned: the unique constraint decides, so of two concurrent starts
    one inserts and the other waits for its commit, then gets its run. The
    conflict is rolled back to the savepoint, so the caller's transaction
    stays usable.
    """
    db = _db(db)
    try:
        with transaction.atomic(using=db):
            take_sqlite_write_lock(db)
            run = _insert_run(
                db,
                name=name,
                input=input,
                steps=steps,
                queue_name=queue_name,
                idempotency_key=idempotency_key,
                build_job=build_job,
            )
        return run, True
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = (
            WorkflowRun.objects.using(db).filter(name=name, idempotency_key=idempotency_key).first()
        )
        if existing is None:
            raise
        return existing, False


# --- the step job's writes ------------------------------------------------------------


def workflow_task_claim(
    task_id: int, generation: int, job_id: int, *, db: str | None = None
) -> ClaimedStep | None:
    """ready|running -> running with a fresh claim id, for the job entrusted with the step.

    Returns None when this job has no business with the step any more (it
    was reset by a reopen, skipped, cancelled, swept and given to another
    job, or already finished). Re-claiming a ``running`` step is how the
    re-run of a job whose worker was lost (lease expired, or handed back on
    shutdown) takes its step over: the old attempt's claim id stops matching,
    so anything it still writes is rejected. Such a lost attempt is recorded
    as a ``WorkerLost`` error but not counted against ``max_attempts``.
    """
    db = _db(db)
    row = (
        WorkflowTask.objects.using(db)
        .filter(id=task_id, generation=generation, job_id=job_id)
        .values("run_id", "state", "claim_id")
        .first()
    )
    if row is None or row["state"] not in (StepState.READY, StepState.RUNNING):
        return None
    claim_id = secrets.token_hex(16)
    changes: dict[str, Any] = {
        "state": StepState.RUNNING,
        "claim_id": claim_id,
        "attempts": F("attempts") + 1,
        "heartbeat_at": Now(),
        "started_at": Coalesce(F("started_at"), Now()),
        "updated_at": Now(),
    }
    if row["state"] == StepState.RUNNING:
        message = (
            f"the previous attempt's worker lost job {job_id} (died, or handed the job back "
            "on shutdown); the job's re-run took the step over"
        )
        changes["errors"] = JSONAppend(
            "errors", _entry(db, WORKER_LOST_PATH, message, f"{WORKER_LOST_PATH}: {message}\n")
        )
    won = (
        WorkflowTask.objects.using(db)
        .filter(
            id=task_id,
            generation=generation,
            job_id=job_id,
            state=row["state"],
            claim_id=row["claim_id"],
        )
        .update(**changes)
    )
    if not won:
        return None
    return _claimed_step(db, task_id, claim_id)


def _claimed_step(db: str, task_id: int, claim_id: str) -> ClaimedStep | None:
    step = WorkflowTask.objects.using(db).filter(id=task_id, claim_id=claim_id).values().first()
    if step is None:  # voided between the claim and this read
        return None
    run = WorkflowRun.objects.using(db).values("name", "input", "queue_name").get(id=step["run_id"])
    others = WorkflowTask.objects.using(db).filter(run_id=step["run_id"])
    graph = {s["name"]: s for s in others.values("name", "depends_on", "state", "output")}
    deps = {name: s["depends_on"] for name, s in graph.items()}
    outputs = {
        name: graph[name]["output"]
        for name in ancestors(deps, step["name"])
        if graph[name]["state"] in STEP_DONE
    }
    return ClaimedStep(
        task_id=task_id,
        claim_id=claim_id,
        run_id=step["run_id"],
        workflow_name=run["name"],
        name=step["name"],
        handler_path=step["handler_path"],
        generation=step["generation"],
        attempt=step["attempts"],
        failures=step["failures"],
        max_attempts=step["max_attempts"],
        backoff=step["backoff"],
        timeout=step["timeout"],
        checkpoint=step["checkpoint"],
        input=run["input"],
        outputs=outputs,
        queue_name=run["queue_name"],
    )


def workflow_task_progress(
    task_id: int, claim_id: str, checkpoint: Any, *, db: str | None = None
) -> bool:
    """Persist a step's resume cursor (and heartbeat), fenced by its claim."""
    return (
        _claimed(_db(db), task_id, claim_id).update(
            checkpoint=checkpoint, heartbeat_at=Now(), updated_at=Now()
        )
        == 1
    )


def workflow_task_succeed(
    task_id: int, claim_id: str, output: Any, *, build_job: StepJobBuilder, db: str | None = None
) -> bool:
    """running -> succeeded with its output; dependents that became runnable get
    their jobs, and the run may succeed, all in one transaction."""
    db = _db(db)
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        run_id = _run_id_of(db, task_id)
        run = _lock_run(db, run_id) if run_id else None
        if run is None:
            return False
        won = _claimed(db, task_id, claim_id).update(
            state=StepState.SUCCEEDED,
            output=output,
            claim_id=None,
            finished_at=Now(),
            updated_at=Now(),
        )
        if won:
            _advance(db, run, build_job)
    return bool(won)


def workflow_task_fail(
    task_id: int,
    claim_id: str,
    error: dict[str, Any],
    retry_in: float | None,
    *,
    build_job: StepJobBuilder,
    db: str | None = None,
) -> bool:
    """Record a failed attempt: retry with a new job after ``retry_in`` seconds,
    or (None) running -> failed, parking the run as stuck for a person to decide.

    ``error`` is the attempt's exception_class_path, message and traceback;
    the database time is added.
    """
    db = _db(db)
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        run_id = _run_id_of(db, task_id)
        run = _lock_run(db, run_id) if run_id else None
        if run is None:
            return False
        entry = {**error, "at": db_now(db).isoformat()}
        changes: dict[str, Any] = {
            "errors": JSONAppend("errors", entry),
            "failures": F("failures") + 1,
            "claim_id": None,
            "updated_at": Now(),
        }
        if retry_in is None:
            changes.update(state=StepState.FAILED, finished_at=Now())
        else:
            changes.update(state=StepState.READY, job_id=None)
        if not _claimed(db, task_id, claim_id).update(**changes):
            return False
        if retry_in is None:
            _park(db, run["id"])
        else:
            generation = (
                WorkflowTask.objects.using(db).values_list("generation", flat=True).get(id=task_id)
            )
            _enqueue(db, run, [(task_id, generation)], build_job, delay=retry_in)
    return True


def workflow_task_wait_child(
    task_id: int,
    claim_id: str,
    *,
    name: str,
    input: Any,
    steps: Sequence[StepSpec],
    queue_name: str,
    build_job: StepJobBuilder,
    db: str | None = None,
) -> int | None:
    """running -> waiting, inserting the child run; return its id (None: claim lost).

    The step and the child commit together, so a step can never start two
    children for one attempt, nor a child exist for a step that lost its claim.
    """
    db = _db(db)
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        run_id = _run_id_of(db, task_id)
        run = _lock_run(db, run_id) if run_id else None
        if run is None:
            return None
        if not _claimed(db, task_id, claim_id).update(
            state=StepState.WAITING, claim_id=None, updated_at=Now()
        ):
            return None
        child = _insert_run(
            db,
            name=name,
            input=input,
            steps=steps,
            queue_name=queue_name,
            idempotency_key=None,
            build_job=build_job,
            parent_task=(run["id"], task_id),
        )
        WorkflowTask.objects.using(db).filter(id=task_id).update(child_run_id=child.pk)
    return child.pk


# --- operator transitions ------------------------------------------------------------------


def workflow_run_cancel(run_id: int, *, db: str | None = None) -> bool:
    """running|stuck -> cancelled. True only if this call made the change.

    Unfinished steps are cancelled and their claims voided (a running step's
    next write matches nothing); queued and running step jobs are cancelled;
    child runs being waited for are cancelled after commit. A child run's
    cancellation fails its parent's waiting step and parks the parent.
    """
    db = _db(db)
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        run = _lock_run(db, run_id)
        if run is None or run["state"] not in RUN_ACTIVE:
            return False
        live = list(
            WorkflowTask.objects.using(db)
            .filter(
                run_id=run_id,
                state__in=list(STEP_LIVE),
            )
            .values("id", "state", "job_id", "child_run_id")
        )
        WorkflowTask.objects.using(db).filter(id__in=[s["id"] for s in live]).update(
            state=StepState.CANCELLED, claim_id=None, finished_at=Now(), updated_at=Now()
        )
        WorkflowRun.objects.using(db).filter(id=run_id).update(
            state=RunState.CANCELLED, finished_at=Now()
        )
        for step in live:
            if step["job_id"] and step["state"] in (StepState.READY, StepState.RUNNING):
                job_cancel(step["job_id"], db=db)
        if run["parent_task_id"]:
            _child_cancelled(db, run_id, run["parent_task_id"])
        _cancel_children_on_commit(
            db, [s["child_run_id"] for s in live if s["state"] == StepState.WAITING]
        )
    return True


def workflow_run_unpark(run_id: int, *, build_job: StepJobBuilder, db: str | None = None) -> bool:
    """stuck -> running: every failed step gets a fresh attempt budget and a job.

    True only if this call made the change (the run was stuck).
    """
    db = _db(db)
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        run = _lock_run(db, run_id)
        if run is None or run["state"] != RunState.STUCK:
            return False
        failed = list(
            WorkflowTask.objects.using(db)
            .filter(run_id=run_id, state=StepState.FAILED)
            .values_list("id", "generation")
        )
        WorkflowTask.objects.using(db).filter(id__in=[i for i, _ in failed]).update(
            failures=0, child_run_id=None
        )
        WorkflowRun.objects.using(db).filter(id=run_id).update(state=RunState.RUNNING)
        run = {**run, "state": RunState.RUNNING}
        _enqueue(db, run, failed, build_job)
        _advance(db, run, build_job)
    return True


def workflow_task_skip(
    run_id: int, step_name: str, *, build_job: StepJobBuilder, db: str | None = None
) -> bool:
    """An unfinished step -> skipped: it counts as succeeded, with no output.

    Its job is cancelled and a running attempt's claim voided; a child run it
    waited for is cancelled after commit. Dependents that became runnable get
    their jobs; a stuck run with no failed step left runs again; a run whose
    steps are all done succeeds. False when the run is finished or the step
    is already done. Raises ``WorkflowTask.DoesNotExist`` for an unknown step.
    """
    db = _db(db)
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        run = _lock_run(db, run_id)
        # Locked: a concurrent claim (which takes no run lock) waits for us.
        step = (
            WorkflowTask.objects.using(db)
            .filter(run_id=run_id, name=step_name)
            .select_for_update()
            .values("id", "state", "job_id", "child_run_id")
            .get()
        )
        if run is None or run["state"] not in RUN_ACTIVE or step["state"] not in STEP_SKIPPABLE:
            return False
        WorkflowTask.objects.using(db).filter(id=step["id"]).update(
            state=StepState.SKIPPED,
            output=None,
            claim_id=None,
            finished_at=Now(),
            updated_at=Now(),
        )
        if step["job_id"] and step["state"] in (StepState.READY, StepState.RUNNING):
            job_cancel(step["job_id"], db=db)
        if step["state"] == StepState.WAITING:
            _cancel_children_on_commit(db, [step["child_run_id"]])
        _advance(db, run, build_job)
    return True


def workflow_run_reopen(
    run_id: int,
    from_step: str,
    generation: int,
    *,
    build_job: StepJobBuilder,
    db: str | None = None,
) -> bool:
    """Replay a finished or stuck run from ``from_step``: one compare-and-set.

    Wins only if the run is still at ``generation`` (so of two concurrent
    reopens exactly one wins) and succeeded, stuck or cancelled. The run goes
    to ``generation + 1``; ``from_step``, every step depending on it
    (transitively) and every unfinished step restart from scratch (attempts,
    output, checkpoint and errors cleared); other steps keep their outputs.
    Old jobs of restarted steps are cancelled (their claims are void) and
    live child runs of restarted steps cancelled after commit. Raises
    ``WorkflowTask.DoesNotExist`` (changing nothing) for an unknown step.
    """
    db = _db(db)
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        won = (
            WorkflowRun.objects.using(db)
            .filter(id=run_id, generation=generation, state__in=list(RUN_REOPENABLE))
            .update(
                generation=F("generation") + 1,
                state=RunState.RUNNING,
                output=None,
                finished_at=None,
                updated_at=Now(),
            )
        )
        if not won:
            return False
        run = _lock_run(db, run_id)
        assert run is not None
        steps = list(
            WorkflowTask.objects.using(db)
            .filter(run_id=run_id)
            .values("id", "name", "state", "depends_on", "job_id", "child_run_id")
        )
        graph = {s["name"]: s["depends_on"] for s in steps}
        if from_step not in graph:
            raise WorkflowTask.DoesNotExist(f"run {run_id} has no step {from_step!r}")
        names = {from_step} | descendants(graph, from_step)
        reset = [s for s in steps if s["name"] in names or s["state"] in STEP_UNFINISHED]
        WorkflowTask.objects.using(db).filter(id__in=[s["id"] for s in reset]).update(
            state=StepState.PENDING,
            generation=run["generation"],
            attempts=0,
            failures=0,
            claim_id=None,
            job_id=None,
            child_run_id=None,
            output=None,
            checkpoint=None,
            errors=[],
            ready_at=None,
            heartbeat_at=None,
            started_at=None,
            finished_at=None,
            updated_at=Now(),
        )
        for step in reset:
            if step["job_id"] and step["state"] in (StepState.READY, StepState.RUNNING):
                job_cancel(step["job_id"], db=db)
        _cancel_children_on_commit(
            db, [s["child_run_id"] for s in reset if s["state"] == StepState.WAITING]
        )
        _advance(db, run, build_job)
    return True


# --- maintenance --------------------------------------------------------------------------


def _ago(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(
        Now() - Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def sweep_stale_steps(
    older_than_seconds: float,
    *,
    build_job: StepJobBuilder,
    limit: int = 500,
    db: str | None = None,
) -> list[int]:
    """Recover steps whose job ended without finishing them; return their ids.

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
    db = _db(db)
    candidates = list(
        WorkflowTask.objects.using(db)
        .filter(
            state__in=[StepState.READY, StepState.RUNNING],
            heartbeat_at__lt=_ago(older_than_seconds),
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
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        run = _lock_run(db, step["run_id"])
        if run is None:
            return False
        job_state = Job.objects.using(db).filter(id=step["job_id"]).values_list("state", flat=True)
        state = job_state.first()
        if state in LIVE:
            return False
        message = f"step job {step['job_id']} ended ({state or 'deleted'}) before finishing it"
        entry = _entry(db, STEP_JOB_LOST_PATH, message, f"{STEP_JOB_LOST_PATH}: {message}\n")
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
            _park(db, run["id"])
        else:
            _enqueue(db, run, [(step["id"], row["generation"])], build_job)
    return True


def step_jobs_retry_now(*, task_path: str, db: str | None = None) -> int:
    """Make step jobs waiting out a backoff due now; return how many (for tests)."""
    db = _db(db)
    return (
        Job.objects.using(db)
        .filter(task_path=task_path, state=JobState.PENDING, run_after__gt=Now())
        .update(run_after=Now())
    )
