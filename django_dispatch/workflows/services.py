"""Operator commands on workflow runs, each checking the state it acts on.

The admin and management commands call these; none of them writes a row
(``run_now`` runs a step, through the worker's path: see ``runtime.inline``).
Each returns True only when this call made the change (False: the run or
step was not in a state the action fits, e.g. already finished), except
``replay_run``, which raises a clear error instead.
"""

from __future__ import annotations

from django.db import connections
from django.db.models import Min
from django.db.transaction import TransactionManagementError

from ..core.workflow_states import RUN_REOPENABLE, STEP_DONE, StepState
from ..models import WorkflowRun, WorkflowTask
from ..store import db_alias, db_now, read_database_for, using_backend
from ..store import workflows as wf_store
from .engine import build_step_job
from .exceptions import ActionNotAllowed, AlreadyReopened


def cancel_run(run_id: int, *, backend: str | None = None) -> bool:
    """Cancel a running or stuck run: pending step jobs are cancelled, running
    steps' claims become void (their results are discarded), child runs it
    waits for are cancelled too.

    ``backend`` (here and below): the TASKS alias whose database holds the
    run. None: the enclosing ``store.using_backend`` block's, else the
    ``default`` alias's; never a worker's served database (see ``cancel``)."""
    with using_backend(backend):
        return wf_store.workflow_run_cancel(run_id)


def retry_run(run_id: int, *, backend: str | None = None) -> bool:
    """Unpark a stuck run: its failed steps run again with a fresh attempt budget."""
    with using_backend(backend):
        return wf_store.workflow_run_unpark(run_id, build_job=build_step_job)


def skip_step(run_id: int, step_name: str, *, backend: str | None = None) -> bool:
    """Skip an unfinished step: dependents go on as if it succeeded with no output."""
    with using_backend(backend):
        return wf_store.workflow_step_skip(run_id, step_name, build_job=build_step_job)


def run_now(run_id: int, *, backend: str | None = None) -> list[int]:
    """Run the run's next runnable step here, now, instead of waiting for a worker's poll.

    The calling process claims the job of the run's first ``ready`` step
    (in definition order; one waiting out a retry's backoff too) by id,
    with a worker's lease, and runs it through the worker's own path (see
    ``runtime.inline``): retries, parking, the run's advancement, durable
    waits, usage records and timeouts are a worker's. It returns once the
    step's outcome is committed. One step only: the steps it makes ready
    are taken by workers (or by calling ``run_now`` again).

    Returns the ids of the step jobs it ran: ``[job_id]``, or ``[]`` when
    nothing could be claimed (the run waits for an event, a timer or a
    child run, is stuck or finished, its next step is already claimed by a
    worker or another ``run_now``, or its queue is paused or has
    ``DISPATCH["QUEUES"]`` limits: such steps are left to the workers,
    whose claim enforces them; so is a child of a large ``ctx.map`` set
    whose step runs in a batch, whose job would run the batch's other
    children too).

    Raises ``TypeError`` for a ``run_id`` that is not an int,
    ``WorkflowRun.DoesNotExist`` for an unknown run, and
    ``TransactionManagementError`` inside ``transaction.atomic()``: the claim
    and the outcome are committed by this call, which the caller's
    transaction would hold back; nothing is written in all three cases.
    """
    if isinstance(run_id, bool) or not isinstance(run_id, int):
        raise TypeError(
            f"run_now() takes a workflow run's id (an int, e.g. run.pk), got {run_id!r}."
        )
    with using_backend(backend) as db:
        return _run_next_step(run_id, db)


def _run_next_step(run_id: int, db: str) -> list[int]:
    if connections[db].in_atomic_block:
        raise TransactionManagementError(
            "run_now() cannot run inside transaction.atomic() (or ATOMIC_REQUESTS): it commits "
            "the step's claim and outcome itself, and runs the step on a thread with its own "
            "connection, which cannot see uncommitted rows. Call it once your transaction "
            "has committed, e.g. transaction.on_commit(lambda: run_now(run.pk)). Nothing was run."
        )
    # Imported here: only run_now needs the worker machinery, and the admin
    # imports this module in every web process.
    from ..runtime.inline import run_next_step

    return run_next_step(run_id)


def stuck_steps(run_id: int, *, backend: str | None = None) -> list[str]:
    """Names of the run's failed steps (what parks it), in definition order."""
    return list(
        WorkflowTask.objects.using(_read(backend))
        .filter(run_id=run_id, state=StepState.FAILED)
        .order_by("sequence")
        .values_list("name", flat=True)
    )


def current_steps(run_id: int, *, backend: str | None = None) -> list[str]:
    """Names of the run's unfinished steps, in definition order (the first is "current")."""
    return list(
        WorkflowTask.objects.using(_read(backend))
        .filter(run_id=run_id)
        .exclude(state__in=list(STEP_DONE))
        .order_by("sequence")
        .values_list("name", flat=True)
    )


def replay_run(
    run_id: int, from_step: str, *, generation: int | None = None, backend: str | None = None
) -> WorkflowRun:
    """Reopen a finished or stuck run from ``from_step``; return the run.

    ``from_step`` and every step depending on it run again with the code
    deployed now; earlier outputs are kept. ``generation`` is the run's
    generation the caller saw (default: the current one): if another reopen
    got in first, ``AlreadyReopened`` is raised and nothing changes.
    Raises ``ActionNotAllowed`` for a run still running, and
    ``WorkflowTask.DoesNotExist`` for an unknown step.
    """
    with using_backend(backend) as db:
        return _replay_run(run_id, from_step, generation, db)


def _replay_run(run_id: int, from_step: str, generation: int | None, db: str) -> WorkflowRun:
    run = WorkflowRun.objects.using(db).get(id=run_id)
    if not WorkflowTask.objects.using(db).filter(run_id=run_id, name=from_step).exists():
        raise WorkflowTask.DoesNotExist(f"run {run_id} ({run.name}) has no step {from_step!r}.")
    seen = run.generation if generation is None else generation
    already = AlreadyReopened(
        f"run {run_id} was reopened or changed by someone else (it is no longer at "
        f"generation {seen}); nothing was changed. Reload and try again."
    )
    # Generation first: a run another reopen just restarted is "running", but
    # what this caller needs to hear is that someone else got in first.
    if run.generation != seen:
        raise already
    if run.state not in RUN_REOPENABLE:
        raise ActionNotAllowed(
            f"run {run_id} is {run.state}; only succeeded, stuck or cancelled runs can be "
            "replayed (cancel it first, or wait for it to finish)."
        )
    if not wf_store.workflow_run_reopen(run_id, from_step, seen, build_job=build_step_job):
        raise already
    run.refresh_from_db(using=db)
    return run


def children(run_id: int, *, backend: str | None = None) -> list[WorkflowRun]:
    """The child runs started by this run's steps (one query, oldest first)."""
    return list(
        WorkflowRun.objects.using(_read(backend)).filter(parent_run_id=run_id).order_by("id")
    )


def _read(backend: str | None) -> str:
    """Where to read rows no write depends on: the alias's database, or the
    current one, or (outside any) the routers' read choice."""
    return read_database_for(backend, WorkflowRun)


def oldest_runnable_age() -> float:
    """Seconds the oldest runnable step has waited for a worker (0.0: none waits).

    A step is runnable once it is ready and its backoff has passed. Feed this
    to an autoscaler: it grows when workers fall behind. Database clock; one
    probe of a partial index.
    """
    db = db_alias()
    now = db_now(db)
    oldest = (
        WorkflowTask.objects.using(db)
        .filter(state=StepState.READY, ready_at__lte=now)
        .aggregate(oldest=Min("ready_at"))["oldest"]
    )
    return 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
