"""The claim: lease runnable jobs to a worker, in one short transaction.

A claim reads candidates from one *source* and passes them through the
*gates*:

- sources, each giving the due jobs it locked, in claim order (priority
  desc, run_after, id): ``sources.fused_pg`` (PostgreSQL: the scan and the
  lease of unkeyed rows in one statement), ``sources.orm`` (SQLite) and
  ``sources.resources`` (a worker with ``--capacity`` or ``--locality``:
  only jobs that fit it);
- gates, each keeping rows, passing some by for this claim, or setting some
  aside: ``gates.partitions`` (a partition's head only, while nothing else
  of it runs), ``gates.limits`` (concurrency and rate limits of task groups
  and queues) and ``gates.placement`` (what fits this worker together).

Rows set aside (demoted behind their partition's head, blocked by a limit)
leave the claim index for good, so while a round sets rows aside and slots
are free, the claim reads on past them, up to ``DEMOTE_BUDGET`` per claim.
``leasing.jobs_lease`` then writes the lease of the rows chosen in Python.
Rows locked by another claimer are skipped, never waited for, so concurrent
workers never take the same job. Deferred jobs are ``scheduled``, outside
the claim indexes; the claim first stages the due ones (``staging``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models.functions import Now

from ..core.states import JobState
from ..models import Job
from .base import db_alias, pending_priorities, take_sqlite_write_lock
from .flow import claimable_queues, flow_state_read, queues_paused
from .gates.limits import ConcurrencyGate
from .gates.partitions import sort_out_partitions
from .gates.placement import fit
from .gates.promotion import concurrency_promote
from .leasing import claimed_job, jobs_lease
from .sources.fused_pg import claim_pg
from .sources.orm import runnable_candidates
from .sources.resources import candidates as resource_candidates
from .sources.shapes import shapes_could_run
from .staging import STAGE_BATCH, jobs_stage_due
from .types import CLAIM_FIELDS, ClaimedJob, FlowSource, FlowState, Placement

#: At most this many jobs are set aside per claim transaction, which bounds
#: its length; each one leaves the claim index for good, so the next claim
#: goes on where this one stopped.
DEMOTE_BUDGET = 1000
#: Rows read per round once rows have been set aside (the first round reads
#: exactly the free slots, so unpartitioned claims read no extra rows).
DEMOTE_WINDOW = 64


def jobs_claim(
    *,
    worker_id: str,
    queues: Sequence[str],
    limit: int,
    lease_seconds: float,
    db: str | None = None,
    namespace: str = "",
    flow: FlowSource = flow_state_read,
    placement: Placement | None = None,
    stage: int = STAGE_BATCH,
) -> list[ClaimedJob]:
    """Lease up to ``limit`` runnable jobs of ``namespace`` to ``worker_id``, in claim order.

    Only pending jobs whose run_after has passed on the database clock, in
    the given queues (empty: every queue) and not paused, are eligible; of a
    partition only its head while nothing else of it runs; of a limited
    group only what its limits admit. One short transaction, committed before
    any task code runs.

    ``flow(db, namespace)`` gives what the caller knows of paused queues,
    waiting groups and queue limits (a worker's ``runtime.flow_cache``; by
    default, read now). It is called inside the claim's transaction, once the
    SQLite write lock is held: on SQLite a transaction that reads before it
    writes cannot take the write lock if another connection wrote meanwhile
    ("database is locked", without waiting).
    ``placement``: a worker with capacity or a locality claims only jobs that
    fit it; None (every other worker): jobs without needs.
    ``stage``: first make up to that many due scheduled jobs pending
    (``staging.jobs_stage_due``), in this transaction, so this claim sees
    them; 0: not this time (a worker stages once per half poll interval).
    """
    db = db or db_alias()
    # savepoint=False: the worker calls this inside its own wave transaction
    with transaction.atomic(using=db, savepoint=False):
        take_sqlite_write_lock(db)
        if stage > 0:
            jobs_stage_due(db=db, namespace=namespace, limit=stage)
        state = flow(db, namespace)
        served, paused = claimable_queues(queues, state.paused)
        if state.paused and not served and not paused:
            return []  # every queue this worker serves is paused
        if state.waiting:  # groups with jobs set aside: free slots refill first
            concurrency_promote(db, namespace, state)
        fused = connections[db].vendor == "postgresql" and placement is None
        claim = _Claim(
            db, namespace, worker_id, limit, lease_seconds, served, paused, state, placement, fused
        )
        while claim.round() and claim.free > 0 and claim.set_aside < DEMOTE_BUDGET:
            claim.window = max(claim.free, DEMOTE_WINDOW)
        if not claim.chosen and not claim.leased:
            return []
        now: datetime = claim.now or (claim.chosen or claim.leased)[0]["db_now"]
        if claim.chosen:
            jobs_lease(db, claim.chosen, worker_id, now, lease_seconds)
    rows = sorted(
        claim.leased + claim.chosen, key=lambda r: (-r["priority"], r["run_after"], r["id"])
    )
    return [claimed_job(row, worker_id, now, namespace) for row in rows]


@dataclass(slots=True)
class _Claim:
    """One claim's progress over its rounds: what it leased, chose and passed by."""

    db: str
    namespace: str
    worker_id: str
    limit: int
    lease_seconds: float
    queues: list[str]
    paused: list[str]
    flow: FlowState
    placement: Placement | None = None
    fused: bool = False
    window: int = 0
    leased: list[dict[str, Any]] = field(default_factory=list)  # by the fused statement
    chosen: list[dict[str, Any]] = field(default_factory=list)  # runnable, lease to write
    passed: list[int] = field(default_factory=list)  # looked at, neither taken nor set aside
    set_aside: int = 0
    gate: ConcurrencyGate | None = None
    #: The claim's one clock, its first read's: its leases are stamped with it,
    #: and its gates count rate windows at it. On SQLite each round's read has
    #: a clock of its own, and a window counted at a later round's could be the
    #: next one, empty, while the leases are stamped in a full one.
    now: datetime | None = None

    def __post_init__(self) -> None:
        self.window = self.limit

    @property
    def free(self) -> int:
        return self.limit - len(self.chosen) - len(self.leased)

    def round(self) -> int:
        """Read one window from the source and pass it through the gates; return how
        many rows this round set aside (0: reading on would find nothing new)."""
        rows = self.read()
        if self.now is None and (rows or self.leased):
            self.now = (rows or self.leased)[0]["db_now"]
        free = self.free
        runnable, set_aside = sort_out_partitions(
            self.db, rows, self.chosen, self.passed, self.namespace
        )
        limits = self.flow.limits
        if any(r["concurrency_key"] is not None or r["queue_name"] in limits for r in runnable):
            self.gate = self.gate or ConcurrencyGate(self.db, self.namespace, limits, self.flow)
            self.gate.now = self.gate.now or self.now
            runnable, skipped, capped = self.gate.sort(runnable, free)
            self.passed += skipped
            set_aside += capped
        if self.placement is not None:
            runnable, unfit = fit(self.placement, runnable, free)
            self.passed += unfit
        self.chosen += runnable[:free]
        self.passed += [r["id"] for r in runnable[free:]]
        self.set_aside += set_aside
        return set_aside

    def read(self) -> list[dict[str, Any]]:
        """The source's next window of locked candidates, past every row seen so far
        (our own locks are not skipped)."""
        seen = self.passed + [r["id"] for r in self.chosen] + [r["id"] for r in self.leased]
        if self.fused:
            # Only the first round may lease unkeyed rows in the statement: later
            # rounds read past set-aside rows, where an unkeyed row must not take
            # the slot of a keyed head ahead of it.
            first = self.window == self.limit and not (seen or self.set_aside)
            took, rows = claim_pg(
                self.db,
                self.queues,
                self.window,
                seen,
                lease=self.free if first else 0,
                worker_id=self.worker_id,
                lease_seconds=self.lease_seconds,
                namespace=self.namespace,
                paused=self.paused,
                limited=sorted(self.flow.limits),
            )
            self.leased += took
            return rows
        if self.placement is not None:
            return resource_candidates(
                self.db,
                self.queues,
                self.window,
                seen,
                namespace=self.namespace,
                placement=self.placement,
                fields=CLAIM_FIELDS,
                paused=self.paused,
            )
        return runnable_candidates(
            self.db,
            self.queues,
            self.window,
            exclude=seen,
            namespace=self.namespace,
            paused=self.paused,
        )


def jobs_due_exist(
    *,
    queues: Sequence[str],
    db: str | None = None,
    namespace: str = "",
    placement: Placement | None = None,
) -> bool:
    """Whether any job of ``namespace`` that this worker could run is due now
    (pending, or scheduled and due: the next claim stages it).

    A claim can come back empty while such jobs exist (they wait behind
    their partition's running head), so ``--burst`` asks this before exiting.
    Probed one priority at a time, of the jobs without needs and of each shape
    the worker could hold, as the claim reads them (``runnable_candidates``):
    one probe of a claim index would read every deferred job before answering no.
    """
    db = db or db_alias()
    due = Job.objects.using(db).filter(
        namespace=namespace, state=JobState.PENDING, run_after__lte=Now()
    )
    # A deferred job that came due and is not staged yet (the next claim
    # stages it), through the stager's index, in whatever queue:
    staged_next = Job.objects.using(db).filter(
        namespace=namespace, state=JobState.SCHEDULED, run_after__lte=Now()
    )
    paused_set = frozenset(queues_paused(db, namespace=namespace))
    queues, paused = claimable_queues(queues, paused_set)
    if paused_set and not queues and not paused:
        return False  # every queue asked about is paused: nothing can be claimed
    if queues:
        due = due.filter(queue_name__in=list(queues))
        staged_next = staged_next.filter(queue_name__in=list(queues))
    if paused:
        due = due.exclude(queue_name__in=paused)
        staged_next = staged_next.exclude(queue_name__in=paused)
    if staged_next.exists():
        return True
    for shape in [None, *shapes_could_run(db, namespace, placement)]:
        for priority in pending_priorities(db, namespace, shape):
            if due.filter(resource_shape=shape, priority=priority).exists():
                return True
    return False
