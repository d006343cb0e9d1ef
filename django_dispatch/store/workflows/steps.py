"""Step transitions: the step job's claim and its fenced writes, and the operator's skip.

A step job first *claims* its step (a compare-and-set only the job entrusted
with the step, for the step's current generation, can win), getting a fresh
random ``claim_id``. Every later write of that attempt goes through
``claim_fence``, so it changes nothing once the claim is void.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass
from typing import Any

from django.db.models import F
from django.db.models.functions import Coalesce, Now

from ...core.workflow_states import RUN_ACTIVE, STEP_DONE, STEP_SKIPPABLE, StepState
from ...models import WorkflowTask
from ..base import db_now
from ..maintenance import WORKER_LOST_PATH
from ..sql import JSONAppend
from . import pgpath, pgsucceed, preclaim
from .admission import refuse_held_skip
from .common import (
    RunSpec,
    StepJobBuilder,
    advance,
    ancestors,
    claim_fence,
    db_or_default,
    enqueue_steps,
    error_at,
    locked_run,
    park,
)
from .runs import STOP_FIELDS, insert_run, stop_steps
from .waits import NO_WAIT, timed_out_entry


@dataclass(frozen=True, slots=True)
class ClaimedStep:
    """A step as it stands right after its job's claim; ``claim_id`` fences writes."""

    step_id: int
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
    #: The results of the step's finished waits, in call order (see ``waits``).
    waits: list[Any] = dataclasses.field(default_factory=list)
    #: The run's call context (who or what started it).
    call_context: Any = None
    #: Whether the run is a child of a ``ctx.map`` set.
    map_child: bool = False
    #: That set (``map_child``), and whether the step was claimed by the
    #: wave that leased its job (``preclaim``): its success may then be
    #: left to the job's wave (``mapwave``).
    map_batch: str | None = None
    preclaimed: bool = False


def workflow_step_claim(
    step_id: int, generation: int, job_id: int, *, epoch: int | None = None, db: str | None = None
) -> ClaimedStep | None:
    """ready|running -> running with a fresh claim id, for the job entrusted with the step.

    Returns None when this job has no business with the step any more (it
    was reset by a reopen, skipped, cancelled, swept and given to another
    job, or already finished). Re-claiming a ``running`` step is how the
    re-run of a job whose worker was lost (lease expired, or handed back on
    shutdown) takes its step over: the old attempt's claim id stops matching,
    so anything it still writes is rejected. Such a lost attempt is recorded
    as a ``WorkerLost`` error but not counted against ``max_attempts``. No
    run lock: what the claim may change is this step row only.

    On PostgreSQL, a ready step is usually claimed already, by the worker's
    wave that leased this job (``preclaim``): the claim is taken from there,
    by the attempt of that lease (``epoch``).

    A ``waiting`` step is claimed by its timer job once ``wait_until`` has
    passed: the wait timed out (or the sleep is over), which is recorded in
    ``waits`` by the same compare-and-set, so a publish racing with the
    timer either wins before it (the job no longer matches) or finds the
    step running.
    """
    db = db_or_default(db)
    kept = None if epoch is None else preclaim.take(db, step_id, generation, job_id, epoch)
    if kept is not None:  # claimed by the wave that leased the job, committed with its lease
        return claimed_from(db, step_id, kept[0], kept[1], preclaimed=True)
    claim_id = secrets.token_hex(16)
    # The usual case first, in one statement: a ready step (which holds no claim).
    if pgpath.applies(db):  # with its read, in that one statement
        claimed = pgpath.claim_ready(db, step_id, generation, job_id, claim_id)
        if claimed is not None:
            return claimed_from(db, step_id, claim_id, claimed)
    changes: dict[str, Any] = {
        "state": StepState.RUNNING,
        "claim_id": claim_id,
        "attempts": F("attempts") + 1,
        "heartbeat_at": Now(),
        "started_at": Coalesce(F("started_at"), Now()),
        "updated_at": Now(),
    }
    steps = WorkflowTask.objects.using(db).filter(id=step_id, generation=generation, job_id=job_id)
    if not pgpath.applies(db) and steps.filter(state=StepState.READY).update(**changes):
        return _claimed_step(db, step_id, claim_id)
    row = steps.values("run_id", "state", "claim_id", "wait_event_name", "wait_until").first()
    if row is None or row["state"] not in (StepState.READY, StepState.RUNNING, StepState.WAITING):
        return None
    if row["state"] == StepState.WAITING and row["wait_until"] is None:
        return None  # a child run or an event with no timeout: not this job's to end
    if row["state"] == StepState.RUNNING:
        message = (
            f"the previous attempt's worker lost job {job_id} (died, or handed the job back "
            "on shutdown); the job's re-run took the step over"
        )
        changes["errors"] = JSONAppend("errors", error_at(db, WORKER_LOST_PATH, message))
    fence = WorkflowTask.objects.using(db).filter(
        id=step_id,
        generation=generation,
        job_id=job_id,
        state=row["state"],
        claim_id=row["claim_id"],
    )
    if row["state"] == StepState.WAITING:
        fence = fence.filter(wait_until__lte=Now())
        entry = timed_out_entry(row["wait_event_name"])
        changes.update(waits=JSONAppend("waits", entry), **NO_WAIT)
    won = fence.update(**changes)
    if not won:
        return None
    return _claimed_step(db, step_id, claim_id)


#: What a claimed step's attempt reads of its step row, and (in the same query) of its run.
_STEP_FIELDS = pgpath.STEP_FIELDS
_RUN_FIELDS = pgpath.RUN_FIELDS


def _claimed_step(db: str, step_id: int, claim_id: str) -> ClaimedStep | None:
    step = (
        WorkflowTask.objects.using(db)
        .filter(id=step_id, claim_id=claim_id)
        .values(*_STEP_FIELDS, *(f"run__{name}" for name in _RUN_FIELDS))
        .first()
    )
    if step is None:  # voided between the claim and this read
        return None
    return claimed_from(db, step_id, claim_id, step)


def claimed_from(
    db: str, step_id: int, claim_id: str, step: dict[str, Any], *, preclaimed: bool = False
) -> ClaimedStep:
    """The claimed step from its row's ``_STEP_FIELDS`` and its run's (``run__`` + name)."""
    run = {name: step[f"run__{name}"] for name in _RUN_FIELDS}
    outputs: dict[str, Any] = {}
    if step["depends_on"]:  # a first step (every one-step child of a map) has no ancestor
        others = WorkflowTask.objects.using(db).filter(run_id=step["run_id"])
        graph = {s["name"]: s for s in others.values("name", "depends_on", "state", "output")}
        deps = {name: s["depends_on"] for name, s in graph.items()}
        outputs = {
            name: graph[name]["output"]
            for name in ancestors(deps, step["name"])
            if graph[name]["state"] in STEP_DONE
        }
    return ClaimedStep(
        step_id=step_id,
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
        waits=list(step["waits"] or []),
        call_context=run["call_context"],
        map_child=run["map_batch"] is not None,
        map_batch=run["map_batch"],
        preclaimed=preclaimed,
    )


def workflow_step_progress(
    step_id: int, claim_id: str, checkpoint: Any, *, db: str | None = None
) -> bool:
    """Persist a step's resume cursor (and heartbeat), fenced by its claim."""
    return (
        claim_fence(db_or_default(db), step_id, claim_id).update(
            checkpoint=checkpoint, heartbeat_at=Now(), updated_at=Now()
        )
        == 1
    )


def workflow_step_holds(step_id: int, claim_id: str, *, db: str | None = None) -> bool:
    """Whether this claim still holds the step: a read, which locks nothing.

    An atomic step's ``progress()``: writing the step row inside the step's
    long transaction would keep it locked, and a re-claim of the step by the
    job's next worker would wait for a frozen attempt.
    """
    return claim_fence(db_or_default(db), step_id, claim_id).exists()


def workflow_step_succeed(
    step_id: int,
    claim_id: str,
    output: Any,
    *,
    build_job: StepJobBuilder,
    db: str | None = None,
    run_id: int | None = None,
    map_child: bool = False,
) -> bool:
    """running -> succeeded with its output; dependents that became runnable get
    their jobs, and the run may succeed, all in one transaction.

    ``run_id``: the step's run when the caller has it (its claim read it),
    which saves looking it up. ``map_child``: the run is a ``ctx.map`` child
    (its claim read that too), whose success may take one statement (``pgsucceed``).
    """
    db = db_or_default(db)
    if run_id is not None and pgpath.applies(db):
        if map_child:
            fused = pgsucceed.succeed_map_child(db, run_id, step_id, claim_id, output, build_job)
            if fused is not None:
                return fused
        return pgsucceed.succeed(db, run_id, step_id, claim_id, output, build_job)
    with locked_run(db, run_id=run_id, step_id=step_id) as locked:
        if locked is None:
            return False
        won = claim_fence(db, step_id, claim_id).update(
            state=StepState.SUCCEEDED,
            output=output,
            claim_id=None,
            finished_at=Now(),
            updated_at=Now(),
        )
        if won:
            advance(db, locked, build_job)
    return bool(won)


def workflow_step_fail(
    step_id: int,
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
    db = db_or_default(db)
    with locked_run(db, step_id=step_id) as run:
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
        if not claim_fence(db, step_id, claim_id).update(**changes):
            return False
        if retry_in is None:
            park(db, run["id"])
        else:
            generation = (
                WorkflowTask.objects.using(db).values_list("generation", flat=True).get(id=step_id)
            )
            enqueue_steps(db, run, [(step_id, generation)], build_job, delay=retry_in)
    return True


def workflow_step_park(
    step_id: int, claim_id: str, error: dict[str, Any], *, db: str | None = None
) -> bool:
    """running -> failed without counting the attempt, parking the run as stuck.

    For causes no retry can fix and the step's own code cannot be blamed
    for: its workflow or step is no longer defined (a deploy removed it),
    or its output is not JSON. ``failures`` (what ``max_attempts`` counts)
    is left as it was. ``attempts`` keeps this attempt, as it keeps every
    claim's: an attempt number names one claim only (its artifacts are linked
    under it), so a retry from the admin after a fix runs as the next
    attempt, never as this one again (its artifacts' names are taken).
    """
    db = db_or_default(db)
    with locked_run(db, step_id=step_id) as run:
        if run is None:
            return False
        entry = {**error, "at": db_now(db).isoformat(), "counted": False}
        if not claim_fence(db, step_id, claim_id).update(
            state=StepState.FAILED,
            errors=JSONAppend("errors", entry),
            claim_id=None,
            finished_at=Now(),
            updated_at=Now(),
        ):
            return False
        park(db, run["id"])
    return True


def workflow_step_wait_child(
    step_id: int,
    claim_id: str,
    child: RunSpec,
    *,
    build_job: StepJobBuilder,
    db: str | None = None,
) -> int | None:
    """running -> waiting, inserting the child run; return its id (None: claim lost).

    The step and the child commit together, so a step can never start two
    children for one attempt, nor a child exist for a step that lost its claim
    (which is also why a child run needs no idempotency key: give it none).
    """
    db = db_or_default(db)
    with locked_run(db, step_id=step_id) as run:
        if run is None:
            return None
        if not claim_fence(db, step_id, claim_id).update(
            state=StepState.WAITING, claim_id=None, updated_at=Now()
        ):
            return None
        child = dataclasses.replace(child, namespace=run["namespace"])  # the parent's
        inserted = insert_run(db, child, build_job, parent_step=(run["id"], step_id))
        WorkflowTask.objects.using(db).filter(id=step_id).update(child_run_id=inserted.pk)
    return inserted.pk


def workflow_step_skip(
    run_id: int, step_name: str, *, build_job: StepJobBuilder, db: str | None = None
) -> bool:
    """An unfinished step -> skipped: it counts as succeeded, with no output.

    Its job is cancelled and a running attempt's claim voided; a child run it
    waited for is cancelled after commit. Dependents that became runnable get
    their jobs; a stuck run with no failed step left runs again; a run whose
    steps are all done succeeds. False when the run is finished or the step
    is already done. Raises ``WorkflowTask.DoesNotExist`` for an unknown step,
    ``ActionNotAllowed`` for a step of a ``ctx.map`` child its set still holds.
    """
    db = db_or_default(db)
    with locked_run(db, run_id=run_id) as run:
        # Locked: a concurrent claim (which takes no run lock) waits for us.
        step = (
            WorkflowTask.objects.using(db)
            .filter(run_id=run_id, name=step_name)
            .select_for_update()
            .values(*STOP_FIELDS)
            .get()
        )
        if run is None or run["state"] not in RUN_ACTIVE or step["state"] not in STEP_SKIPPABLE:
            return False
        refuse_held_skip(db, run, step_name)
        WorkflowTask.objects.using(db).filter(id=step["id"]).update(
            state=StepState.SKIPPED,
            output=None,
            claim_id=None,
            finished_at=Now(),
            updated_at=Now(),
        )
        stop_steps(db, [step])
        advance(db, run, build_job)
    return True
