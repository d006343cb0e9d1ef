"""One-step ``ctx.map`` children's successes written by the wave that finishes
their jobs (PostgreSQL: ``django_dispatch_finish_map_wave``, migrations 0036 and 0038).

Written by its own statement, a child's success is a round trip of its own
and a count on the parent step, a row every child of the set locks in turn.
Here a child whose step the wave claimed (``preclaim``) leaves its success
with this process (``defer``) and its job's success goes to the wave as any
job's: the wave's statement writes the child's step and run first, then the
jobs (``store.wave``), all committed together. After the commit, the
children it wrote are counted on their parent step, one update per set
(``committed``: the follow-ups the caller runs off its hot path), the count
that reaches the total gathers, and a child the wave did not write (a fence
did not match, or the general path must decide) has its success written as
its job would have (its ``fallback``).

Only a child of a set known to need nothing of the general path is left
here: a set is known once a child's one-statement success (``pgsucceed``)
wrote in this process (no other step in the child's run, no child left to
admit: both stay so for that set). Every other way a deferred job is
finished writes the child's success first, by the general path (``flush``:
a wave in a transaction, a success written one by one, a failed wave).
A child's success left here is lost with the process, as its job's is:
the job's lease expires, its re-run takes the step over and runs it again.
A child the wave did not write has its success written after its job's
committed: every fence that failed in the wave (the run no longer running
or already counted, the claim taken over, another step in the run, a set
still admitting) still fails there, so the general path discards it, and a
process that dies in between leaves the step to the stale-step sweep.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from ...models import WorkflowTask
from ..sql import int_array, text_array
from . import pgpath
from .common import StepJobBuilder, db_or_default, gather

if TYPE_CHECKING:
    from .steps import ClaimedStep

logger = logging.getLogger("django_dispatch.store")

#: More deferred successes than any worker has slots: past it, the oldest
#: are written by their fallback at once.
_LIMIT = 10_000
#: Sets remembered as needing nothing of the general path (``learn``).
_SETS = 1_000
#: The output column's encoder: a child's output is written as the ORM writes it.
_ENCODER = WorkflowTask._meta.get_field("output").encoder


@dataclass(frozen=True, slots=True)
class Deferred:
    """A child's success, for the attempt of the lease ``epoch`` of its job."""

    epoch: int
    run_id: int
    step_id: int
    claim_id: str
    output: Any
    build_job: StepJobBuilder
    #: Writes the success by the general path, as the job would have.
    fallback: Callable[[], Any]


_lock = threading.Lock()
#: By (database, job id).
_pending: dict[tuple[str, int], Deferred] = {}
#: (database, set) of sets whose children take the one-statement success.
_sets: dict[tuple[str, str], None] = {}


def learn(db: str, batch: str) -> None:
    """A child of ``batch`` took the one-statement success: its set's other
    children may be left to the wave."""
    with _lock:
        _sets[(db, batch)] = None
        while len(_sets) > _SETS:
            del _sets[next(iter(_sets))]


def workflow_step_succeed_with_job(
    claimed: ClaimedStep,
    output: Any,
    job_id: int,
    epoch: int,
    *,
    build_job: StepJobBuilder,
    fallback: Callable[[], Any],
    db: str | None = None,
) -> bool:
    """Leave a map child's success to the wave that finishes its job (the
    attempt of lease ``epoch`` of ``job_id``); False: write it now."""
    if not (claimed.map_child and claimed.preclaimed):
        return False  # not in a worker whose waves claim steps
    d = Deferred(
        epoch, claimed.run_id, claimed.step_id, claimed.claim_id, output, build_job, fallback
    )
    return defer(db_or_default(db), job_id, claimed.map_batch, d)


def defer(db: str, job_id: int, batch: str | None, success: Deferred) -> bool:
    """Leave a child's success to its job's wave, if its set is known (``learn``)."""
    if batch is None or not pgpath.applies(db):
        return False
    dropped = []
    with _lock:
        if (db, batch) not in _sets:
            return False
        _pending[(db, job_id)] = success
        while len(_pending) > _LIMIT:
            dropped.append(_pending.pop(next(iter(_pending))))
    for old in dropped:
        _run(old.fallback)
    return True


def pending(db: str, leases: Iterable[tuple[int, int]]) -> list[tuple[int, Deferred]]:
    """The deferred successes of these (job id, epoch) leases, left in place
    until their wave commits (``committed``) or fails (``flush``)."""
    with _lock:
        if not _pending:
            return []
        found = [(job, epoch, _pending.get((db, job))) for job, epoch in leases]
    return [(job, d) for job, epoch, d in found if d is not None and d.epoch == epoch]


def params(db: str, children: Sequence[tuple[int, Deferred]]) -> dict[str, Any]:
    """The wave function's child arrays (0036's ``p_runs`` ...), in run id order."""
    ordered = sorted((d for _, d in children), key=lambda d: d.run_id)
    return {
        "map_runs": int_array(d.run_id for d in ordered),
        "map_steps": int_array(d.step_id for d in ordered),
        "map_claims": text_array(d.claim_id for d in ordered),
        "map_outputs": text_array(
            None if d.output is None else json.dumps(d.output, cls=_ENCODER) for d in ordered
        ),
    }


def committed(
    db: str, children: Sequence[tuple[int, Deferred]], mapped: Any
) -> list[Callable[[], None]]:
    """After the wave's commit: the children are done here; what is left to do
    (each set's count, the fallback of a child the wave did not write)."""
    with _lock:
        for job, _ in children:
            _pending.pop((db, job), None)
    return written(db, [d for _, d in children], mapped)


def rows_of(mapped: Any) -> list[list[Any]]:
    """The children a set statement wrote (0038's ``mapped``): (run id, parent
    step id, parent run id, set), in the statement's order."""
    return json.loads(mapped) if isinstance(mapped, str) else (mapped or [])


def written(db: str, children: Sequence[Deferred], mapped: Any) -> list[Callable[[], None]]:
    """After a set statement's commit: what is left to do for ``children``
    (each set's count, the fallback of a child the statement did not write)."""
    rows = {row[0]: row for row in rows_of(mapped)}
    sets: dict[tuple[int, str, int], list[Deferred]] = defaultdict(list)
    actions: list[Callable[[], None]] = []
    for d in children:
        row = rows.get(d.run_id)
        if row is None:
            actions.append(d.fallback)
        else:
            sets[(row[1], row[3], row[2])].append(d)
    for (step, batch, parent_run), done in sets.items():
        actions.append(partial(count, db, step, batch, parent_run, len(done), done[0].build_job))
    return actions


def flush(db: str, job_id: int, epoch: int) -> None:
    """Before a job is finished other than by a wave that carries its child:
    write the child's success by the general path, if it was left here."""
    with _lock:
        d = _pending.get((db, job_id))
        if d is None or d.epoch != epoch:
            return
        del _pending[(db, job_id)]
    _run(d.fallback)


def count(
    db: str, step_id: int, batch: str, parent_run: int, n: int, build_job: StepJobBuilder
) -> None:
    """Count ``n`` children written on their waiting step; the count that
    reaches the total gathers. It raises: the caller may try once more on a
    new connection, and else leaves the set to the stale-map sweep
    (``gather_stalled``), which counts it from the children's rows (an
    extra count is harmless: ``gather`` checks those rows again)."""
    counts = pgpath.count_many(db, step_id, batch, n)
    if counts is not None and counts[0] >= (counts[1] or 0):
        gather(db, step_id, batch, parent_run, build_job)


def _run(fallback: Callable[[], Any]) -> None:
    try:
        fallback()
    except Exception:
        logger.exception("a map child's deferred success could not be written")
