"""What the workflow store's modules share: the run lock, the claim fence, moving a run on.

``locked_run`` is the one opening of every run transition, and of every step
transition that may change what else in the run can go on: one short
transaction that first locks the run row (an UPDATE of ``updated_at``; on
SQLite, the database write lock). So transitions of one run are serialized,
and locks are always taken run first, then its steps, then jobs; a child
run's transaction may then lock its parent run, never the other way round
(cascades down to child runs run after commit), so two transactions cannot
deadlock on each other's runs.

``claim_fence`` is the other half: the step row while one exact claim still
holds it. Every write of a step attempt matches it, so a write from a void
claim changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F, QuerySet
from django.db.models.functions import Now

from ...core.workflow_states import RUN_ACTIVE, STEP_DONE, RunState, StepState
from ...models import Job, WorkflowRun, WorkflowTask
from ..base import db_alias, db_now, error_entry, now_plus, take_sqlite_write_lock
from ..enqueue import jobs_insert
from ..sql import JSONAppend

#: (step_id, generation, queue_name) -> an unsaved step Job.
StepJobBuilder = Callable[[int, int, str], Job]
#: A locked run's fields, as ``lock_run`` reads them (``RUN_FIELDS``).
RunRow = Mapping[str, Any]

STEP_JOB_LOST_PATH = "django_dispatch.workflows.exceptions.StepJobLost"
CHILD_CANCELLED_PATH = "django_dispatch.workflows.exceptions.ChildRunCancelled"

RUN_FIELDS = ("id", "name", "state", "generation", "queue_name", "parent_task_id", "namespace")


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
class RunSpec:
    """A run to insert: which workflow, its input and step snapshot, its queue."""

    name: str
    input: Any
    steps: Sequence[StepSpec]
    queue_name: str
    idempotency_key: str | None = None
    #: The namespace of the backend that started it (a child run: its parent's).
    namespace: str = ""
    #: Who or what started it (JSON; a child run: its parent's).
    call_context: Any = None


# --- the dependency graph ---------------------------------------------------------


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


# --- the lock and the fence ---------------------------------------------------------


def db_or_default(db: str | None) -> str:
    return db or db_alias()


@contextmanager
def write_transaction(db: str) -> Iterator[None]:
    """One short transaction that writes first (on SQLite: takes the write lock up front)."""
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        yield


def run_id_of(db: str, step_id: int) -> int | None:
    return (
        WorkflowTask.objects.using(db).filter(id=step_id).values_list("run_id", flat=True).first()
    )


def lock_run(db: str, *, run_id: int | None = None, step_id: int | None = None) -> RunRow | None:
    """Lock (and touch) a run row for this transaction, given it or one of its steps.

    Returns the run's ``RUN_FIELDS``, or None when there is no such run (or step).
    """
    if run_id is None and step_id is not None:
        run_id = run_id_of(db, step_id)
    if not run_id:
        return None
    if not WorkflowRun.objects.using(db).filter(id=run_id).update(updated_at=Now()):
        return None
    return WorkflowRun.objects.using(db).filter(id=run_id).values(*RUN_FIELDS).first()


@contextmanager
def locked_run(
    db: str, *, run_id: int | None = None, step_id: int | None = None
) -> Iterator[RunRow | None]:
    """THE opening of a run transition: a write transaction with the run row locked.

    Yields the run's fields (see ``lock_run``), or None when the run or step
    does not exist, in which case the caller changes nothing. Whatever the
    caller writes in the block commits with the lock released at its end.
    """
    with write_transaction(db):
        yield lock_run(db, run_id=run_id, step_id=step_id)


def claim_fence(db: str, step_id: int, claim_id: str) -> QuerySet[WorkflowTask]:
    """THE fence: the step while this exact claim still holds it."""
    return WorkflowTask.objects.using(db).filter(
        id=step_id, claim_id=claim_id, state=StepState.RUNNING
    )


def error_at(db: str, path: str, message: str, **extra: Any) -> dict[str, Any]:
    """An error entry (traceback: ``path: message``) stamped with the database clock."""
    traceback = f"{path}: {message}\n"
    return {**error_entry(path, message, traceback), "at": db_now(db).isoformat(), **extra}


def park(db: str, run_id: int) -> None:
    """running -> stuck: a step is out of attempts, a person decides what comes next."""
    WorkflowRun.objects.using(db).filter(id=run_id, state=RunState.RUNNING).update(
        state=RunState.STUCK
    )


# --- moving a run on (all called with the run locked) ---------------------------------


def enqueue_steps(
    db: str,
    run: RunRow,
    items: Sequence[tuple[int, int]],
    build_job: StepJobBuilder,
    *,
    delay: float | None = None,
) -> None:
    """Make steps ready and insert one job per (step_id, generation), in this transaction."""
    if not items:
        return
    jobs = [build_job(step_id, generation, run["queue_name"]) for step_id, generation in items]
    for job in jobs:  # a step's job runs in its run's namespace
        job.namespace = run.get("namespace", "")
    ready_at = now_plus(delay) if delay else Now()
    if delay:
        for job in jobs:
            job.run_after = now_plus(delay)  # type: ignore[assignment]
    jobs_insert(jobs, db=db)
    for (step_id, _), job in zip(items, jobs, strict=True):
        WorkflowTask.objects.using(db).filter(id=step_id).update(
            state=StepState.READY,
            job_id=job.pk,
            claim_id=None,
            ready_at=ready_at,
            heartbeat_at=Now(),
            finished_at=None,
            updated_at=Now(),
        )


def advance(db: str, run: RunRow, build_job: StepJobBuilder) -> None:
    """After a step finished or was skipped: start what became runnable, end the run.

    Pending steps whose dependencies are all done get their jobs; a run whose
    steps are all done succeeds (with its last step's output) and, if it is a
    child run, completes the parent's waiting step; a stuck run with no failed
    step left runs again.
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
    enqueue_steps(db, run, runnable, build_job)
    runs = WorkflowRun.objects.using(db).filter(id=run["id"])
    if steps and len(done) == len(steps):
        output = steps[-1]["output"]
        runs.update(state=RunState.SUCCEEDED, output=output, finished_at=Now())
        if run["parent_task_id"]:
            _child_succeeded(db, run["id"], run["parent_task_id"], output, build_job)
    elif run["state"] == RunState.STUCK and not any(s["state"] == StepState.FAILED for s in steps):
        runs.update(state=RunState.RUNNING)


def _child_succeeded(
    db: str, child_id: int, parent_step_id: int, output: Any, build_job: StepJobBuilder
) -> None:
    """The parent's waiting step succeeds with the child's output (child run locked)."""
    parent = lock_run(db, step_id=parent_step_id)
    if parent is None:
        return
    if _waiting_for(db, parent_step_id, child_id).update(
        state=StepState.SUCCEEDED, output=output, finished_at=Now(), updated_at=Now()
    ):
        advance(db, parent, build_job)


def child_cancelled(db: str, child_id: int, parent_step_id: int) -> None:
    """The parent's waiting step fails for good, parking its run (child run locked)."""
    parent = lock_run(db, step_id=parent_step_id)
    if parent is None:
        return
    entry = error_at(db, CHILD_CANCELLED_PATH, f"child run {child_id} was cancelled")
    if _waiting_for(db, parent_step_id, child_id).update(
        state=StepState.FAILED,
        errors=JSONAppend("errors", entry),
        failures=F("failures") + 1,
        finished_at=Now(),
        updated_at=Now(),
    ):
        park(db, parent["id"])


def _waiting_for(db: str, step_id: int, child_id: int) -> QuerySet[WorkflowTask]:
    """The step while it still waits for this child run."""
    return WorkflowTask.objects.using(db).filter(
        id=step_id, state=StepState.WAITING, child_run_id=child_id
    )
