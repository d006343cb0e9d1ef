"""What the workflow store's modules share: the run lock, the claim fence, moving a run on.

``locked_run`` is the one opening of every run transition, and of every step
transition that may change what else in the run can go on: one short
transaction that first locks the run row (an UPDATE of ``updated_at``; on
SQLite, the database write lock). So transitions of one run are serialized,
and locks are always taken run first, then its steps, then jobs; a child
run's transaction may then lock its parent run, never the other way round
(cascades down to child runs run after commit), so two transactions cannot
deadlock on each other's runs. One transaction goes down: a ``ctx.map``
child's success, holding its parent run while the set has held children,
admits a held sibling; it takes the sibling's row only if no other
transaction holds it (SKIP LOCKED), and otherwise leaves the admission to
the next success (see ``_admit``). A child's success is counted on its
parent step: on PostgreSQL a one-step child's in the same statement as its
success (``pgpath``), otherwise after it commits, in a statement of its own
(``count_map_child``).

``claim_fence`` is the other half: the step row while one exact claim still
holds it. Every write of a step attempt matches it, so a write from a void
claim changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import F, QuerySet
from django.db.models.functions import Now

from ...core.workflow_states import RUN_ACTIVE, STEP_DONE, RunState, StepState
from ...models import WorkflowRun, WorkflowTask
from ..base import db_alias, db_now, error_entry, take_sqlite_write_lock
from ..sql import JSONAppend
from . import pgpath
from .admission import admit_next
from .stepjobs import RunRow, StepJobBuilder, enqueue_steps

STEP_JOB_LOST_PATH = "django_dispatch.workflows.exceptions.StepJobLost"
CHILD_CANCELLED_PATH = "django_dispatch.workflows.exceptions.ChildRunCancelled"

RUN_FIELDS = (
    "id",
    "name",
    "state",
    "generation",
    "queue_name",
    "parent_task_id",
    "parent_run_id",
    "namespace",
    "map_batch",
)


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
    #: Where its jobs go; None: the run's queue, the step task's priority.
    queue_name: str | None = None
    priority: int | None = None


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


def lock_run(db: str, *, run_id: int | None = None, step_id: int | None = None) -> RunRow | None:
    """Lock (and touch) a run row for this transaction, given it or one of its steps.

    Returns the run's ``RUN_FIELDS``, or None when there is no such run (or step).
    """
    if run_id is None and step_id is not None:
        steps = WorkflowTask.objects.using(db).filter(id=step_id)
        run_id = steps.values_list("run_id", flat=True).first()
    if not run_id:
        return None
    if connections[db].vendor == "postgresql":  # the lock and the read in one round trip
        with connections[db].cursor() as cursor:
            cursor.execute(_LOCK_RUN_SQL, [run_id])
            row = cursor.fetchone()
        return None if row is None else dict(zip(RUN_FIELDS, row, strict=True))
    if not WorkflowRun.objects.using(db).filter(id=run_id).update(updated_at=Now()):
        return None
    return WorkflowRun.objects.using(db).filter(id=run_id).values(*RUN_FIELDS).first()


#: ``lock_run``'s UPDATE of ``updated_at`` returning ``RUN_FIELDS`` (each its
#: own column's name: the foreign keys are named by their ``_id`` columns).
_LOCK_RUN_SQL = (
    f'UPDATE "{WorkflowRun._meta.db_table}" SET updated_at = STATEMENT_TIMESTAMP() '
    "WHERE id = %s RETURNING " + ", ".join(f'"{name}"' for name in RUN_FIELDS)
)


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


def advance(
    db: str, run: RunRow, build_job: StepJobBuilder, *, steps: Sequence[Mapping[str, Any]] = ()
) -> None:
    """After a step finished or was skipped: start what became runnable, end the run.

    Pending steps whose dependencies are all done get their jobs; a run whose
    steps are all done succeeds (with its last step's output) and, if it is a
    child run, completes the parent's waiting step; a stuck run with no failed
    step left runs again. ``steps``: the run's steps as they stand now, in
    definition order, when the caller read them already (``pgpath``).
    """
    if not steps:
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
        succeeded = {
            "state": RunState.SUCCEEDED,
            "output": output,
            "finished_at": Now(),
            "updated_at": Now(),
        }
        if run["parent_task_id"] and run.get("map_batch"):
            # Only its first success counts a map child: a child replayed after
            # that is gathered with its new output, never counted twice.
            if pgpath.applies(db):
                first, counts = pgpath.map_child_done(
                    db, run["id"], output, run["parent_task_id"], run["map_batch"]
                )
            else:
                first = bool(runs.filter(map_counted=False).update(**succeeded, map_counted=True))
                counts = map_waiting(db, run["parent_task_id"], run["map_batch"]).values_list(
                    "map_started", "map_total"
                ).first() or (None, None)  # a read: no lock
            if first:
                _map_child_succeeded(db, run, build_job, counts)
            else:  # a replayed child: only the gather counts it again (now succeeded)
                runs.update(**succeeded)
                step, batch, parent = run["parent_task_id"], run["map_batch"], run["parent_run_id"]
                transaction.on_commit(
                    lambda: gather(db, step, batch, parent, build_job), using=db, robust=True
                )
            return
        runs.update(**succeeded)
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


def child_cancelled(
    db: str, child_id: int, parent_step_id: int, map_batch: str | None = None
) -> bool:
    """The parent's waiting step fails for good, parking its run (child run locked).

    ``map_batch``: the child is one of a ``ctx.map`` set, which the step
    must still wait for. True when the step failed (False: it no longer
    waited for this child).
    """
    parent = lock_run(db, step_id=parent_step_id)
    if parent is None:
        return False
    entry = error_at(db, CHILD_CANCELLED_PATH, f"child run {child_id} was cancelled")
    waiting = (
        _waiting_for(db, parent_step_id, child_id)
        if map_batch is None
        else map_waiting(db, parent_step_id, map_batch)
    )
    if waiting.update(
        state=StepState.FAILED,
        errors=JSONAppend("errors", entry),
        failures=F("failures") + 1,
        finished_at=Now(),
        updated_at=Now(),
    ):
        park(db, parent["id"])
        return True
    return False


def map_waiting(db: str, step_id: int, batch: str) -> QuerySet[WorkflowTask]:
    """The step while it still waits for the ``ctx.map`` set ``batch``."""
    return WorkflowTask.objects.using(db).filter(
        id=step_id, state=StepState.WAITING, map_batch=batch
    )


def _map_child_succeeded(
    db: str, child: RunRow, build_job: StepJobBuilder, counts: Sequence[int | None]
) -> None:
    """A ``ctx.map`` child succeeded for the first time (it locked, not its parent).

    Its transaction does not take the parent run's lock, nor write the
    waiting step, while the set still has children to admit it does not:
    thousands of children then commit side by side. It is counted on the step
    once it has committed (``count_map_child``). Only while held children
    remain (a ``max_parallel`` set) does it lock the parent run, to admit the
    next one in its place: at most ``max_parallel`` children wait for that lock.
    """
    step_id, batch, parent_id = child["parent_task_id"], child["map_batch"], child["parent_run_id"]
    waiting = map_waiting(db, step_id, batch)
    if counts[0] is None:
        return  # the step no longer waits for this set (failed, skipped, replayed)
    if counts[0] < (counts[1] or 0) and lock_run(db, run_id=parent_id) is not None:
        # Read again under the lock: another success may have admitted meanwhile.
        started, total = waiting.values_list("map_started", "map_total").first() or (0, 0)
        if started < (total or 0):
            admit_next(db, waiting, batch, started, total or 0, build_job)
    transaction.on_commit(
        lambda: count_map_child(db, step_id, batch, parent_id, build_job), using=db, robust=True
    )


def count_map_child(
    db: str, step_id: int, batch: str, parent_run_id: int, build_job: StepJobBuilder
) -> None:
    """After a child's success committed: count it on the waiting step; the last gathers.

    One statement in autocommit (on PostgreSQL an ``UPDATE ... RETURNING``),
    so the step row is locked for that statement only, never across a
    round trip of the child's transaction: the same cost for the 10,000th
    child as for the 10th. Counted after the commit, so a count reaching the
    total means every child's success is visible to the gather. A count lost
    to a crash just after a child's commit is repaired by the sweep
    (``gather_stalled``), which gathers the same way.
    """
    counts = _count_one(db, step_id, batch)
    if counts is not None and counts[0] >= (counts[1] or 0):
        gather(db, step_id, batch, parent_run_id, build_job)


def _count_one(db: str, step_id: int, batch: str) -> tuple[int, int | None] | None:
    """map_done + 1 on the step still waiting for ``batch``: (done, total), or None."""
    if pgpath.applies(db) and connections[db].get_autocommit():
        return pgpath.count_child(db, step_id, batch)
    waiting = map_waiting(db, step_id, batch)
    with write_transaction(db):
        if not waiting.update(map_done=F("map_done") + 1, updated_at=Now()):
            return None
        return waiting.values_list("map_done", "map_total").get()


def gather(
    db: str, step_id: int, batch: str, parent_run_id: int, build_job: StepJobBuilder
) -> bool:
    """waiting -> succeeded with the set's outputs in input order, if every child is
    counted; the parent run moves on. True if it gathered.

    The one read of the whole set, under the parent run's lock: it checks
    every child itself (the counter only says when to look), and otherwise
    sets the counter to what it found. A child counted once and replayed
    since is not done until it succeeds again (whose success then gathers).
    The step's row is locked before the children are read: a child's count
    (``count_map_child``, not under the run's lock) committed between the
    read and the reset would otherwise be overwritten, and the set would
    wait for the sweep.
    """
    with locked_run(db, run_id=parent_run_id) as run:
        waiting = map_waiting(db, step_id, batch)
        total = (
            waiting.select_for_update().values_list("map_total", flat=True).first() if run else None
        )
        if run is None or total is None:
            return False
        children = WorkflowRun.objects.using(db).filter(map_batch=batch)
        counted = children.filter(map_counted=True, state=RunState.SUCCEEDED).count()
        if counted < total:
            waiting.update(map_done=counted, updated_at=Now())
            return False
        outputs = list(children.order_by("map_index").values_list("output", flat=True))
        waiting.update(
            state=StepState.SUCCEEDED, output=outputs, map_done=counted, finished_at=Now()
        )
        advance(db, run, build_job)
    return True


def _waiting_for(db: str, step_id: int, child_id: int) -> QuerySet[WorkflowTask]:
    """The step while it still waits for this child run."""
    return WorkflowTask.objects.using(db).filter(
        id=step_id, state=StepState.WAITING, child_run_id=child_id
    )
