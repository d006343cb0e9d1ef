"""Run transitions: start, cancel, unpark (retry) and reopen (replay from a step)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef
from django.db.models.functions import Now

from ...core.workflow_states import (
    RUN_ACTIVE,
    RUN_REOPENABLE,
    STEP_LIVE,
    STEP_UNFINISHED,
    RunState,
    StepState,
)
from ...models import WorkflowRun, WorkflowTask
from ..maintenance import job_cancel
from .common import (
    RunSpec,
    StepJobBuilder,
    advance,
    child_cancelled,
    db_or_default,
    descendants,
    enqueue_steps,
    lock_run,
    locked_run,
    write_transaction,
)
from .stepjobs import shared

#: What ``stop_steps`` needs to know of each step it stops.
STOP_FIELDS = ("id", "state", "job_id", "child_run_id", "map_batch")
#: A step's ``ctx.map`` set cleared (a reset step starts a fresh one).
NO_MAP: dict[str, Any] = {
    "map_batch": None,
    "map_total": None,
    "map_started": 0,
    "map_done": 0,
    "map_max_parallel": None,
}


def insert_run(
    db: str,
    spec: RunSpec,
    build_job: StepJobBuilder,
    *,
    parent_step: tuple[int, int] | None = None,
) -> WorkflowRun:
    """Insert a run, its steps and the jobs of its first steps, in the caller's transaction.

    ``parent_step`` is (run id, step id) of the step starting a child run.
    """
    run = WorkflowRun(
        namespace=spec.namespace,
        name=spec.name,
        state=RunState.RUNNING,
        input=spec.input,
        queue_name=spec.queue_name,
        idempotency_key=spec.idempotency_key,
        call_context=spec.call_context,
        parent_run_id=parent_step[0] if parent_step else None,
        parent_task_id=parent_step[1] if parent_step else None,
    )
    run.save(using=db, force_insert=True)
    rows = WorkflowTask.objects.using(db).bulk_create(step_rows(run, spec))
    fields = {"id": run.pk, "queue_name": spec.queue_name, "namespace": spec.namespace}
    first = [r for r in rows if not r.depends_on]
    routes = {r.pk: (r.queue_name, r.priority) for r in first}
    enqueue_steps(db, fields, [(r.pk, r.generation) for r in first], build_job, routes=routes)
    return run


def step_rows(run: WorkflowRun, spec: RunSpec) -> list[WorkflowTask]:
    """The unsaved step rows of ``run``: the snapshot of its definition."""
    return [
        WorkflowTask(
            run=run,
            namespace=run.namespace,
            name=s.name,
            sequence=s.sequence,
            handler_path=s.handler_path,
            depends_on=list(s.depends_on),
            max_attempts=s.max_attempts,
            backoff=s.backoff,
            timeout=s.timeout,
            queue_name=s.queue_name,
            priority=s.priority,
            generation=run.generation,
        )
        for s in spec.steps
    ]


def workflow_run_insert(
    spec: RunSpec, *, build_job: StepJobBuilder, db: str | None = None
) -> tuple[WorkflowRun, bool]:
    """Insert a run, all its steps, and the jobs of its first steps; return (run, created).

    One transaction (a savepoint inside the caller's). With an idempotency
    key held by a run of the same workflow, nothing is inserted and that run
    is returned: the unique constraint decides, so of two concurrent starts
    one inserts and the other waits for its commit, then gets its run. The
    conflict is rolled back to the savepoint, so the caller's transaction
    stays usable.
    """
    db = db_or_default(db)
    try:
        with write_transaction(db):
            run = insert_run(db, spec, build_job)
        return run, True
    except IntegrityError:
        if spec.idempotency_key is None:
            raise
        existing = (
            WorkflowRun.objects.using(db)
            .filter(namespace=spec.namespace, name=spec.name, idempotency_key=spec.idempotency_key)
            .first()
        )
        if existing is None:
            raise
        return existing, False


def stop_steps(db: str, steps: Iterable[Mapping[str, Any]], *, children: bool = True) -> None:
    """Stop the work behind steps just moved out of their state (``STOP_FIELDS`` read before).

    Jobs of ready and running steps are cancelled (a running attempt's claim
    is already void, so its next write matches nothing), but for a batch's
    job, which its other children's steps still need (``mapbatch``). Child runs of
    waiting steps, a ``ctx.map`` set's unfinished children included, are
    cancelled after commit: a child run is locked only after its parent is
    released, keeping the lock order. Not with ``children=False``: the
    orphan sweep (``orphans``), which passes it, takes them itself, within
    its time on the leader's loop.
    """
    waited, batches = [], []
    for step in steps:
        if (
            step["job_id"]
            and step["state"]
            in (
                StepState.READY,
                StepState.RUNNING,
                StepState.WAITING,  # a wait's timer job
            )
            and not shared(db, step["job_id"])
        ):
            job_cancel(step["job_id"], db=db)
        if step["state"] == StepState.WAITING and step["child_run_id"]:
            waited.append(step["child_run_id"])
        if step["state"] == StepState.WAITING and step.get("map_batch"):
            batches.append(step["map_batch"])
    if children and (waited or batches):
        transaction.on_commit(lambda: cancel_children(db, waited, batches), using=db)


def cancel_children(db: str, children: Sequence[int], batches: Sequence[str]) -> None:
    """Cancel child runs, and the unfinished children of ``ctx.map`` sets.

    A set's held children (never admitted: no step has had a job) are
    cancelled together in one transaction; the others one by one, each with
    its own jobs, claims and children.
    """
    for batch in batches:
        cancel_held(db, batch)
        live = WorkflowRun.objects.using(db).filter(map_batch=batch, state__in=list(RUN_ACTIVE))
        children = [*children, *live.order_by("map_index").values_list("id", flat=True)]
    for child in children:
        workflow_run_cancel(child, db=db)


def cancel_held(db: str, batch: str) -> list[int]:
    """running -> cancelled for the held children of a ``ctx.map`` set; return their ids.

    Only for a set its step no longer waits for (failed, reset, run
    cancelled: the step is not told), so no admission can run any more: a
    child is either admitted (its first steps have jobs) and left to
    ``workflow_run_cancel``, or still held and cancelled here, steps and
    all, with nothing else to stop. The parent run is not locked: the rows
    written are the held children's only, locked in id order first, so two
    cancels of one set (the commit's own, the orphan sweep's) take turns,
    the second finding none left.
    """
    runs = WorkflowRun.objects.using(db)
    with write_transaction(db):
        has_job = WorkflowTask.objects.using(db).filter(run_id=OuterRef("pk"), job_id__isnull=False)
        held = runs.filter(map_batch=batch, state=RunState.RUNNING).exclude(Exists(has_job))
        ids = list(held.order_by("id").select_for_update().values_list("id", flat=True))
        if not ids:
            return []
        steps = WorkflowTask.objects.using(db).filter(state__in=list(STEP_LIVE))
        for chunk in range(0, len(ids), 500):  # SQLite's bound on parameters
            part = ids[chunk : chunk + 500]
            steps.filter(run_id__in=part).update(
                state=StepState.CANCELLED, finished_at=Now(), updated_at=Now()
            )
            runs.filter(id__in=part, state=RunState.RUNNING).update(
                state=RunState.CANCELLED, finished_at=Now(), updated_at=Now()
            )
    return ids


def workflow_run_cancel(
    run_id: int,
    *,
    db: str | None = None,
    generation: int | None = None,
    children: bool = True,
) -> bool:
    """running|stuck -> cancelled. True only if this call made the change.

    Unfinished steps are cancelled and their claims voided (a running step's
    next write matches nothing); queued and running step jobs are cancelled;
    child runs being waited for are cancelled after commit (with
    ``children``; see ``stop_steps``). A child run's
    cancellation fails its parent's waiting step and parks the parent.
    ``generation``: only while the run is still at it (not replayed since).
    """
    db = db_or_default(db)
    with locked_run(db, run_id=run_id) as run:
        if run is None or run["state"] not in RUN_ACTIVE:
            return False
        if generation is not None and run["generation"] != generation:
            return False
        live = list(
            WorkflowTask.objects.using(db)
            .filter(run_id=run_id, state__in=list(STEP_LIVE))
            .values(*STOP_FIELDS)
        )
        WorkflowTask.objects.using(db).filter(id__in=[s["id"] for s in live]).update(
            state=StepState.CANCELLED, claim_id=None, finished_at=Now(), updated_at=Now()
        )
        WorkflowRun.objects.using(db).filter(id=run_id).update(
            state=RunState.CANCELLED, finished_at=Now()
        )
        stop_steps(db, live, children=children)
        batch = run["map_batch"]
        failed = run["parent_task_id"] and child_cancelled(db, run_id, run["parent_task_id"], batch)
        if failed and batch:  # the map's step failed: its other children's work is moot
            transaction.on_commit(lambda: cancel_children(db, [], [batch]), using=db)
    return True


def workflow_run_unpark(run_id: int, *, build_job: StepJobBuilder, db: str | None = None) -> bool:
    """stuck -> running: every failed step gets a fresh attempt budget and a job.

    True only if this call made the change (the run was stuck).
    """
    db = db_or_default(db)
    with locked_run(db, run_id=run_id) as run:
        if run is None or run["state"] != RunState.STUCK:
            return False
        failed = list(
            WorkflowTask.objects.using(db)
            .filter(run_id=run_id, state=StepState.FAILED)
            .values_list("id", "generation")
        )
        WorkflowTask.objects.using(db).filter(id__in=[i for i, _ in failed]).update(
            failures=0, child_run_id=None, **NO_MAP
        )
        WorkflowRun.objects.using(db).filter(id=run_id).update(state=RunState.RUNNING)
        run = {**run, "state": RunState.RUNNING}
        enqueue_steps(db, run, failed, build_job)
        advance(db, run, build_job)
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
    db = db_or_default(db)
    with write_transaction(db):
        # The compare-and-set is this transition's opening: its UPDATE takes
        # the run's row lock, which ``lock_run`` then holds and reads.
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
        run = lock_run(db, run_id=run_id)
        assert run is not None
        steps = list(
            WorkflowTask.objects.using(db)
            .filter(run_id=run_id)
            .values("name", "depends_on", *STOP_FIELDS)
        )
        graph = {s["name"]: s["depends_on"] for s in steps}
        if from_step not in graph:
            raise WorkflowTask.DoesNotExist(f"run {run_id} has no step {from_step!r}")
        names = {from_step} | descendants(graph, from_step)
        reset = [s for s in steps if s["name"] in names or s["state"] in STEP_UNFINISHED]
        _restart_steps(db, reset, run["generation"])
        advance(db, run, build_job)
    return True


def _restart_steps(db: str, steps: Sequence[Mapping[str, Any]], generation: int) -> None:
    """Put ``steps`` back to ``pending`` at ``generation``, as if never run, and stop
    what they had going (their jobs cancelled; live child runs after commit)."""
    WorkflowTask.objects.using(db).filter(id__in=[s["id"] for s in steps]).update(
        state=StepState.PENDING,
        generation=generation,
        attempts=0,
        failures=0,
        claim_id=None,
        job_id=None,
        child_run_id=None,
        output=None,
        checkpoint=None,
        errors=[],
        waits=[],
        wait_event_name=None,
        wait_event_key=None,
        wait_until=None,
        ready_at=None,
        heartbeat_at=None,
        started_at=None,
        finished_at=None,
        updated_at=Now(),
        **NO_MAP,
    )
    stop_steps(db, steps)
