"""Step claims made by the wave that leases their jobs, kept for the jobs to take.

A step job's first statement is its step's claim (``steps.workflow_step_claim``).
On PostgreSQL the worker's wave (``store.wave``), or its claim outside a wave
(``sources.fused_pg``), claims the steps of the step jobs it leases in its
own statement (the function of migrations 0035 and 0038), so a
step job, and every ``ctx.map`` child, saves that round trip and commit. The
claims wait here, by job id, until the job's attempt takes its own; a job
that finds none (run elsewhere, or its step was locked at the wave) claims its
step itself, as on SQLite.

A claim taken here is exactly the one the wave wrote: the step was ``ready``,
entrusted to this job, for this generation, and is now ``running`` with this
claim id, committed with the job's lease. Only the process that wrote the
wave holds it, and ``take`` hands it out once, to the attempt of that lease
(its epoch), after a read if it was kept longer than ``FRESH_SECONDS``. A
job its own process hands back unstarted has its claim undone (``release``);
a claim otherwise never taken (the job cancelled before it started, the
worker killed, or recycled: its successor hands the job back without the
claim, which lived in this process) leaves the step ``running``, which the
job's next run takes over as from a lost worker. Kept only once the statement has committed: a
wave carries the claims only in autocommit, and a claim inside a transaction
keeps them on its commit (``transaction.on_commit``), never before a
rollback could still undo them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db.models import Case, F, Value, When
from django.db.models.functions import Now

from ...core.workflow_states import StepState
from ...models import WorkflowTask
from . import pgpath

#: The task of every step job (``workflows.tasks.run_step``): its jobs' args are
#: ``[step_id, generation]``.
STEP_TASK = "django_dispatch.workflows.tasks.run_step"

#: The CTE of a wave or claim that claims the steps of the step jobs it leased, once (a
#: MATERIALIZED CTE whose function runs exactly once), after the lease (it
#: reads the lease's result). Its rows, joined to the wave's candidates by job
#: id, lead each record (``COLUMNS``); jobs with no step claimed get NULLs.
#: Only jobs the lease took: a candidate only locked must not have its step
#: claimed. A job whose args are not ``[step_id, generation]``, two whole
#: numbers (a ``run_step`` enqueued by hand), is left out by the pattern checks
#: rather than failing the wave's cast: its job claims nothing in the wave and
#: finds it has no step. No step job leased: no call (``HAVING``). No braces in
#: the text: the wave's template goes through ``str.format``.
_STEPS_CTE = """,
steps AS MATERIALIZED (
    SELECT s.* FROM (
        SELECT array_agg(c.id ORDER BY c.id) AS jobs,
            array_agg((c.args->>0)::bigint ORDER BY c.id) AS steps,
            array_agg((c.args->>1)::integer ORDER BY c.id) AS generations
        FROM candidates AS c
        WHERE c.task_path = %(step_task)s AND <LEASED>
            AND (c.args->>0) ~ '^[0-9]+$' AND length(c.args->>0) < 19
            AND (c.args->>1) ~ '^[0-9]+$' AND length(c.args->>1) < 10
        HAVING count(*) > 0
    ) AS w CROSS JOIN LATERAL django_dispatch_wave_step_claims(w.jobs, w.steps, w.generations) AS s
)"""
#: Which candidates were leased: in the wave, those in its lease's sorted ids
#: (``store.wave``); in a claim, those its ``leased`` CTE updated
#: (``sources.fused_pg``).
WAVE_LEASED = "c.id = (SELECT (l.r).leased[width_bucket(c.id, (l.r).leased)] FROM lease AS l)"
CLAIM_LEASED = "c.id IN (SELECT id FROM leased)"


def steps_cte(leased: str) -> str:
    """The CTE claiming the steps of the step jobs ``leased`` selects."""
    return _STEPS_CTE.replace("<LEASED>", leased)


#: How many columns the step claim puts ahead of a wave record's own: the job
#: id, the step id, the claim id, then ``pgpath.claim_ready``'s row.
COLUMNS = 3 + len(pgpath.STEP_FIELDS) + len(pgpath.RUN_FIELDS)
#: More claims than any worker has slots: past it, the oldest are dropped
#: (their jobs claim their steps themselves, taking them over).
_LIMIT = 10_000

#: Seconds a kept claim is handed out as it is. The step can be cancelled,
#: skipped or reopened after the wave committed; a job's own claim would have
#: seen that. So a claim kept longer (a job claimed ahead behind a long one, a
#: slow thread) is read again before its attempt runs the handler: a step
#: voided meanwhile is then not run, as with the job's own claim. Within this
#: window a cancel can still let the handler start once, as one landing just
#: after the job's own claim always could; its writes stay fenced.
FRESH_SECONDS = 0.1

_lock = threading.Lock()
#: By (database, job id): (lease epoch, step id, claim id, fields, kept at).
_claims: dict[tuple[str, int], tuple[int, int, str, Sequence[Any], float]] = {}


def keep(db: str, records: Sequence[Sequence[Any]], skip: int, epochs: Mapping[int, int]) -> None:
    """Keep the step claims of a committed statement's ``records`` (``COLUMNS``
    columns from ``skip`` on), by job id and the epoch of the job's lease
    (``epochs``, by job id): a claim is only for the attempt of that lease."""
    now = time.monotonic()
    with _lock:
        for record in records:
            job = record[skip]
            if job is not None and job in epochs:
                step, claim = record[skip + 1], record[skip + 2]
                fields = record[skip + 3 : skip + COLUMNS]
                _claims[(db, job)] = (epochs[job], step, claim, fields, now)
        while len(_claims) > _LIMIT:
            del _claims[next(iter(_claims))]


def take(
    db: str, step_id: int, generation: int, job_id: int, epoch: int
) -> tuple[str, dict[str, Any]] | None:
    """The claim the wave made of ``step_id`` (of ``generation``) for the lease
    ``epoch`` of ``job_id`` on ``db``, once: (claim id, the step's and its
    run's fields, as ``pgpath.claim_ready``'s)."""
    with _lock:
        kept = _claims.get((db, job_id))
        if kept is None or kept[:2] != (epoch, step_id):
            return None  # another lease's (a stale attempt's) is left for its own
        del _claims[(db, job_id)]
    fields = pgpath.claimed_fields(kept[3])
    if fields["generation"] != generation:
        return None
    if time.monotonic() - kept[4] > FRESH_SECONDS and not _still_held(db, step_id, kept[2]):
        return None  # voided since the wave: the job's own claim finds out how
    return kept[2], fields


def _still_held(db: str, step_id: int, claim_id: str) -> bool:
    """Whether the step is still running under ``claim_id``: a read, no commit."""
    return (
        WorkflowTask.objects.using(db)
        .filter(id=step_id, claim_id=claim_id, state=StepState.RUNNING)
        .exists()
    )


def release(db: str, job_id: int, epoch: int) -> bool:
    """Undo the claim the wave made for the lease ``epoch`` of ``job_id``, if
    its attempt never took it: the job was handed back unstarted (a shutdown,
    a job claimed ahead behind a long one), so its step goes back to ``ready``
    with the attempt count it had, for the job's next run to claim as any
    ready step, and not as a step whose worker was lost. Fenced by the claim
    id: a step voided meanwhile (cancelled, reopened) is left as it is.
    ``started_at`` goes back to NULL when the claim was the generation's
    first (a claim only sets it when NULL, and a reopen clears it with the
    count); ``heartbeat_at`` keeps the claim's time, which only postpones
    the sweep's look at a ready step."""
    with _lock:
        kept = _claims.get((db, job_id))
        if kept is None or kept[0] != epoch:
            return False
        del _claims[(db, job_id)]
    return unclaim(db, kept[1], kept[2])


def unclaim(db: str, step_id: int, claim_id: str) -> bool:
    """``running`` under ``claim_id`` -> ``ready``, as if never claimed (see ``release``)."""
    return bool(
        WorkflowTask.objects.using(db)
        .filter(id=step_id, claim_id=claim_id, state=StepState.RUNNING)
        .update(
            state=StepState.READY,
            claim_id=None,
            attempts=F("attempts") - 1,
            started_at=Case(When(attempts=1, then=Value(None)), default=F("started_at")),
            updated_at=Now(),
        )
    )


class _StepJobs:
    """Whether the next claims should claim the steps of the step jobs they lease.

    The step claim's CTE costs every claim some planning and a join, so a
    worker's claims carry it only while it leases step jobs: from the claim
    after one that leased a step job, until ``CLAIMS`` claims in a row leased
    none. A step job leased by a claim without it claims its step itself, so
    two threads racing on ``left`` change when the CTE is carried, never what
    a step's claim is: no lock."""

    CLAIMS = 64

    def __init__(self) -> None:
        self.left = 0

    def expected(self) -> bool:
        return self.left > 0

    def saw(self, rows: Iterable[Mapping[str, Any]]) -> None:
        if any(row["task_path"] == STEP_TASK for row in rows):
            self.left = self.CLAIMS
        elif self.left:
            self.left -= 1


#: This process's: each worker process claims for itself.
STEP_JOBS = _StepJobs()
