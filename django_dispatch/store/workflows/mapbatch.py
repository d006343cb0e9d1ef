"""Large ``ctx.map`` sets of one-step children, run several children by one job.

A child run by a job of its own costs the job's row, its lease, its finish
and the worker's whole per-job path: at thousands of no-op children those
are most of what a child costs, about three times a plain job. So a set of
one-step children with no timeout and no ``max_parallel``, on PostgreSQL,
is inserted with one job of ``stepjobs.BATCH_TASK`` per ``size_for`` children
(``pgmapset``): its arguments are its children's ``[step_id, generation]``
pairs, and each of those steps is entrusted to it (``job_id``), as a step
is to its own job. The job claims its steps in one statement
(``workflow_steps_claim``), runs their bodies in turn, and writes their
successes in one more (``workflow_steps_succeed``), each child's fenced by
its own claim, as a wave writes them (``mapwave``). The claims can grow
old while earlier children run: the job reads them again, and writes the
successes it holds, whenever a while has passed (``workflows.batches``).

Everything else stays per child. A child that fails, waits, starts a run of
its own, or whose success the set statement leaves out, is recorded by the
general path (``steps``), which gives a retry a job of its own. A step
another job took over, or voided meanwhile, is not claimed by the batch.
A batch whose worker is lost is re-run as any job: it takes over the steps
still ``running`` under its old claims, one by one, as a step job's re-run
does, and skips those already finished. Cancelling one child's step does
not cancel its batch's job (``stepjobs.shared``): the batch's other children still
need it.

Why no batch with a timeout: a step's timeout is enforced on its job
(``runtime.timeouts``), and ending the job would end its siblings. Why none
with ``max_parallel``: admission counts and releases children one job at a
time. Why a floor on the number of jobs (``MIN_JOBS``): the children of one
batch run one after the other, so a set must still spread over a cluster's
threads as it would unbatched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, connections

from ...core.workflow_states import StepState
from ...models import WorkflowTask
from . import mapwave, pgpath, preclaim
from .common import RunSpec, StepJobBuilder, db_or_default
from .steps import ClaimedStep, claimed_from, workflow_step_claim

logger = logging.getLogger("django_dispatch.store")

#: Children per job, at most. Each batch's claim, set of successes, count and
#: job cost the server more than its children's rows: at 16 a job they held a
#: 10,000-item map to under half the rate of plain jobs, at 39 it ran at 61%.
MAX_SIZE = 64
#: Jobs per set, at least, however few its children: children of one batch
#: run in turn, so a set of slow children keeps this many jobs to spread over
#: a cluster's threads.
MIN_JOBS = 256

_CLAIM_SQL = (
    "SELECT * FROM django_dispatch_wave_step_claims(%s::bigint[], %s::bigint[], %s::integer[])"
)
_SUCCEED_SQL = (
    "SELECT django_dispatch_map_wave_children(%(map_runs)s::bigint[], %(map_steps)s::bigint[],"
    " %(map_claims)s::text[], %(map_outputs)s::jsonb[])"
)


def size_for(db: str, spec: RunSpec, total: int, max_parallel: int | None) -> int:
    """Children per job for a set of ``total`` children of ``spec`` (1: a job each)."""
    if max_parallel is not None or len(spec.steps) != 1 or spec.steps[0].timeout is not None:
        return 1
    if not pgpath.applies(db):
        return 1
    return max(1, min(MAX_SIZE, total // MIN_JOBS))


def workflow_steps_claim(
    pairs: Sequence[tuple[int, int]], job_id: int, *, db: str | None = None
) -> list[ClaimedStep | None]:
    """Claim the (step_id, generation) steps entrusted to batch job ``job_id``:
    for each, its claim, or None when the job has no business with it any
    more (see ``workflow_step_claim``). The ready ones in one statement
    (``SKIP LOCKED``, as a wave's claim); any other (a step left running by
    the batch's lost attempt, or row-locked just then) by the step's own claim.
    """
    db = db_or_default(db)
    claimed: dict[int, ClaimedStep] = {}
    if pairs:
        with connections[db].cursor() as cursor:
            cursor.execute(
                _CLAIM_SQL,
                [[job_id] * len(pairs), [s for s, _ in pairs], [g for _, g in pairs]],
            )
            rows = cursor.fetchall()
        for row in rows:
            fields = pgpath.claimed_fields(row[3:])
            claimed[row[1]] = claimed_from(db, row[1], row[2], fields)
    return [
        claimed[step] if step in claimed else workflow_step_claim(step, gen, job_id, db=db)
        for step, gen in pairs
    ]


def workflow_steps_held(claims: Sequence[ClaimedStep], *, db: str | None = None) -> set[int]:
    """The ids of ``claims``' steps still running under them: one read, no
    commit. A batch reads its claims again before running a child whose claim
    is no longer fresh: a step cancelled, skipped or reopened meanwhile must
    not run its body (its writes would be fenced, its side effects not)."""
    if not claims:
        return set()
    rows = WorkflowTask.objects.using(db_or_default(db)).filter(
        id__in=[c.step_id for c in claims], state=StepState.RUNNING
    )
    held = {c.step_id: c.claim_id for c in claims}
    return {i for i, claim in rows.values_list("id", "claim_id") if held[i] == claim}


def workflow_steps_release(claims: Sequence[ClaimedStep], *, db: str | None = None) -> int:
    """Put back to ``ready`` the steps a batch claimed and did not start (its
    job cancelled, or its lease lost), each fenced by its claim: for its job's
    next run, or the sweep, to claim as a step never started, its attempt count
    as it was. A step taken over or voided meanwhile is left as it is."""
    db = db_or_default(db)
    return sum(preclaim.unclaim(db, c.step_id, c.claim_id) for c in claims)


def workflow_steps_succeed(
    successes: Sequence[tuple[ClaimedStep, Any, Callable[[], bool]]],
    *,
    build_job: StepJobBuilder,
    db: str | None = None,
) -> list[bool]:
    """Write the (claimed step, output, fallback) successes of a batch's
    children in one statement, then count them on their sets (the count that
    reaches a total gathers). A child the statement leaves out has its
    success written by its ``fallback`` (the general path), which decides.
    True for each success written.

    Only in autocommit, as a wave: the statement commits on its own, and the
    counts follow its commit. If it fails, nothing of it committed, and each
    child goes to its fallback.
    """
    db = db_or_default(db)
    if not successes:
        return []
    deferred = [
        mapwave.Deferred(0, c.run_id, c.step_id, c.claim_id, output, build_job, fallback)
        for c, output, fallback in successes
    ]
    mapped: Any = None
    if connections[db].get_autocommit():
        try:
            with connections[db].cursor() as cursor:
                cursor.execute(_SUCCEED_SQL, mapwave.params(db, [(0, d) for d in deferred]))
                mapped = cursor.fetchone()[0]
        except DatabaseError:
            logger.warning(
                "a batch of %s map children: their one-statement success failed; each is "
                "written on its own",
                len(deferred),
                exc_info=True,
            )
    if mapped is None:
        return [_fall_back(fallback) for _, _, fallback in successes]
    done = {row[0] for row in mapwave.rows_of(mapped)}
    counted = [d for d in deferred if d.run_id in done]
    for count in mapwave.written(db, counted, mapped):
        try:
            count()
        except Exception:  # left to the stale-map sweep, which counts from the rows
            logger.exception("counting a batch of map children failed; the sweep will")
    return [c.run_id in done or _fall_back(fallback) for c, _, fallback in successes]


def _fall_back(fallback: Callable[[], bool]) -> bool:
    """A child's success by the general path; one that raises is logged, and
    left to its job's re-run or the sweep, and the batch's others go on."""
    try:
        return bool(fallback())
    except Exception:
        logger.exception("a batched map child's success could not be written")
        return False
