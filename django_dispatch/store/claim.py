"""The claim: lease runnable jobs to a worker, in one short transaction.

``runnable_candidates`` is THE claim query, in the ORM: ``claim_candidates``
(the due jobs of one priority) for each pending priority in turn, highest
first, so that jobs deferred to later are never read. ``_CLAIM_SQL`` is the
same walk for PostgreSQL, fused with the lease update of the unkeyed
candidates into one statement: the claim is the hot path of every worker, and
compiling two ORM statements per claim cost more CPU than running them (see
docs/performance.md). ``jobs_claim`` wraps either with the partition rules
(see ``partitions``) and the lease update of keyed heads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Now

from ..compat import TASK_MAX_PRIORITY
from ..conf import queue_limits
from ..core.states import JobState
from ..models import Job
from .sql import JSONAppend
from . import flow, resources
from .base import (
    CLAIM_ORDER,
    db_alias,
    job_sql,
    namespace_literal,
    pending_priorities,
    take_sqlite_write_lock,
)
from .partitions import partition_heads, partitions_demote

#: At most this many blocked jobs are demoted per claim transaction, which
#: bounds its length; each demotion takes a job out of the claim index for
#: good, so the next claim goes on where this one stopped.
DEMOTE_BUDGET = 1000
#: Rows read per round once demotion has started (the first round reads
#: exactly the free slots, so unpartitioned claims read no extra rows).
DEMOTE_WINDOW = 64


@dataclass(frozen=True, slots=True)
class Lease:
    """The token a claim hands out; every later write by the worker carries it.

        ``partition_key`` is the job's key, carried along (not part of the fence,
        nor of equality) so that a batch of completions can take its keys' locks
        before its UPDATE (see ``partitions``). A lease built without it is an
        unkeyed job's as far as ``jobs_finish_many_if_leased`` knows; one built
    without ``namespace`` is a job of the default namespace's.
    """

    job_id: int
    worker_id: str
    epoch: int
    partition_key: str | None = field(default=None, compare=False)
    #: The job's namespace, carried like ``partition_key``: the transitions
    #: that free a key promote its head in this namespace only.
    namespace: str = field(default="", compare=False)


#: Columns a worker needs to run a job; read in the claim so that running a
#: job costs no further SELECT.
CLAIM_FIELDS = (
    "id",
    "task_path",
    "backend",
    "queue_name",
    "priority",
    "run_after",
    "args",
    "kwargs",
    "deferred_until",
    "partition_key",
    "idempotency_key",
    "attempts",
    "max_attempts",
    "worker_lost_count",
    "lease_epoch",
    "checkpoint",
    "errors",
    "worker_ids",
    "enqueued_at",
    "started_at",
    "trace_context",
    "resources",
    "concurrency_key",  # concurrency and rate limits (#17, flow.ConcurrencyGate)
    "concurrency_limit",
    "rate_limit",
    "rate_period",
)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job as it stands right after this worker's claim committed."""

    lease: Lease
    row: dict[str, Any]  # CLAIM_FIELDS, with the claim's own updates applied
    claimed_at: datetime  # database clock

    @property
    def id(self) -> int:
        return self.lease.job_id


def claim_candidates(
    db: str,
    queues: Sequence[str],
    limit: int,
    exclude: Sequence[int] = (),
    *,
    namespace: str = "",
    paused: Sequence[str] = (),
    priority: int,
):
    """Runnable jobs of ``namespace`` and ``priority`` in claim order, locked,
    skipping locked rows: one step of ``runnable_candidates``.

    Served by the partial index ``dispatch_job_claim`` (pending rows only, led
    by the namespace, then the priority), so its cost grows neither with
    finished jobs nor with other namespaces' backlogs, and ``run_after <= now``
    bounds the index range, so deferred jobs are not read.
    """
    candidates = Job.objects.using(db).filter(
        # Jobs with resource needs: only through store.resources (#16).
        namespace=namespace,
        state=JobState.PENDING,
        resource_shape__isnull=True,
        priority=priority,
        run_after__lte=Now(),
    )
    if queues:
        candidates = candidates.filter(queue_name__in=list(queues))
    if exclude:
        candidates = candidates.exclude(id__in=list(exclude))
    if paused:  # queues left out by a pause (see flow.claimable_queues)
        candidates = candidates.exclude(queue_name__in=list(paused))
    return (
        candidates.order_by(*CLAIM_ORDER)
        .select_for_update(skip_locked=True)
        .annotate(db_now=Now())
        .values(*CLAIM_FIELDS, "db_now")[:limit]
    )


def runnable_candidates(
    db: str,
    queues: Sequence[str],
    limit: int,
    exclude: Sequence[int] = (),
    *,
    namespace: str = "",
    paused: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """``claim_candidates`` in claim order, one priority at a time: a loose index scan.

    Why not one query: in ``dispatch_job_claim`` (namespace, priority, run_after, id)
    each priority's deferred jobs follow its due ones, and nothing in the index
    tells the scan that the rest of a priority is deferred. A claim that finds
    fewer due jobs than it wants (every idle poll) or whose due jobs sit at a
    lower priority would read every deferred job of the namespace: a million
    jobs scheduled for next week, on every poll of every worker. Per priority,
    ``run_after <= now`` is a bound of the index range, so each priority costs
    one descent to find it and reads only due jobs. ``_CLAIM_SQL`` does the
    same in one statement (PostgreSQL); this is SQLite's, under its write lock.
    """
    rows: list[dict[str, Any]] = []
    clock: datetime | None = None  # one claim, one clock: the first row's statement's
    for priority in pending_priorities(db, namespace, None):
        for row in claim_candidates(
            db,
            queues,
            limit - len(rows),
            exclude,
            namespace=namespace,
            paused=paused,
            priority=priority,
        ):
            clock = clock or row["db_now"]
            if row["run_after"] <= clock:  # not due when the claim began: left for the next
                row["db_now"] = clock
                rows.append(row)
        if len(rows) >= limit:
            break
    return rows


#: ``runnable_candidates`` plus the lease of its unkeyed rows, for PostgreSQL.
#:
#: ``priorities`` lists the namespace's pending priorities, highest first, one
#: index descent each (a recursive CTE: PostgreSQL 15 has no skip scan). It
#: starts from ``{above_top}``, a constant above the highest priority a job
#: may have (the table's check constraint), which matches no job, rather than
#: from a descent of its own: each mention of the job table makes the planner
#: test every partial index's predicate, which cost more than the descent.
#: (The constraint is built from the same constant: were Django to change
#: it, tests/test_migrations.py would ask for a new migration.)
#: For each priority in turn, ``candidates`` locks its due rows in claim
#: order until it has ``%(window)s``. Per priority, ``run_after <= now()``
#: bounds the index range, so deferred jobs are never read. The nested loop
#: pulls the priorities in the order the recursion yields them and stops at
#: the LIMIT, so no row beyond the window is locked (MATERIALIZED: locked
#: once, read twice).
#:
#: ``leased`` takes the first ``%(lease)s`` unkeyed candidates, exactly as
#: ``jobs_claim``'s ORM update would. Keyed candidates stay locked but
#: untouched: the partition rules decide about them in Python. Every row comes
#: back, in claim order whatever the plan, with its values from before the
#: update (``_claimed`` applies the lease to them) and whether this statement
#: leased it. Served by the partial index ``dispatch_job_claim``, like the ORM
#: query (test_store checks the plan). Table and states come from the models
#: (``job_sql``); tests/test_raw_sql_twins.py runs it beside the ORM path on
#: the same rows.
#:
#: What the walk costs, against one ordered scan of all priorities (the
#: statement before it): PostgreSQL CPU per claim statement 0.69 ms instead
#: of 0.58 (0.75 before the constant), mostly planning; with 11-16 jobs per
#: claim in a drain, under 0.01 ms per job. Drain A/Bs cannot tell it from
#: the machine's noise (docs/performance.md "A/B measurements").
_CLAIM_SQL = """
WITH RECURSIVE priorities AS (
    SELECT {above_top}::smallint AS priority
    UNION ALL
    SELECT (SELECT lower.priority FROM {job} AS lower
            WHERE lower.namespace = {namespace} AND lower.state = {pending}
                AND lower.resource_shape IS NULL AND lower.priority < p.priority
            ORDER BY lower.priority DESC LIMIT 1)
    FROM priorities AS p WHERE p.priority IS NOT NULL
), candidates AS MATERIALIZED (
    SELECT due.* FROM priorities AS p CROSS JOIN LATERAL (
        SELECT {fields}, now() AS db_now
        FROM {job}
        WHERE namespace = {namespace} AND state = {pending} AND resource_shape IS NULL
            AND priority = p.priority AND run_after <= now() {filters}
        ORDER BY run_after, id
        LIMIT %(window)s
        FOR UPDATE SKIP LOCKED
    ) AS due
    LIMIT %(window)s
), leased AS (
    UPDATE {job} AS j SET
        state = {running},
        worker_id = %(worker_id)s::text,
        lease_epoch = j.lease_epoch + 1,
        lease_expires_at = c.db_now + %(lease_seconds)s * interval '1 second',
        heartbeat_at = c.db_now,
        attempts = j.attempts + 1,
        started_at = COALESCE(j.started_at, c.db_now),
        last_attempted_at = c.db_now,
        worker_ids = COALESCE(j.worker_ids, '[]'::jsonb) || jsonb_build_array(%(worker_id)s::text)
    FROM (
        SELECT id, db_now FROM candidates WHERE partition_key IS NULL AND concurrency_key IS NULL
        {lease_filters} ORDER BY priority DESC, run_after, id LIMIT %(lease)s
    ) AS c
    WHERE j.id = c.id
    RETURNING j.id
)
SELECT candidates.*, leased.id IS NOT NULL AS leased
FROM candidates LEFT JOIN leased ON leased.id = candidates.id
ORDER BY candidates.priority DESC, candidates.run_after, candidates.id
"""
#: ``_CLAIM_SQL``'s result columns, in order. Known here rather than read from
#: ``cursor.description``, which psycopg builds anew (a Column per column)
#: on every claim; ``strict`` zipping would catch a mismatch.
_CLAIM_COLUMNS = (*CLAIM_FIELDS, "db_now", "leased")
#: JSON columns of CLAIM_FIELDS: Django's psycopg connection hands jsonb to
#: raw queries as text.
_JSON_FIELDS = (
    "args",
    "kwargs",
    "checkpoint",
    "errors",
    "worker_ids",
    "trace_context",
    "resources",
)
#: The JSON texts most claimed rows carry (no arguments, no errors yet), built
#: without the parser: a fresh object each, since callers may change them.
#: Parsing them was most of the claim's per-row Python cost.
_EMPTY_JSON: dict[str, Callable[[], Any]] = {"[]": list, "{}": dict}


def claim_sql(
    *,
    queues: bool,
    exclude: bool,
    db: str | None = None,
    namespace: str = "",
    paused: bool = False,
    limited: bool = False,
) -> str:
    """``_CLAIM_SQL`` with the filters in use (named parameters, see ``_claim_pg``),
    for database ``db`` (default: the job table's) and ``namespace`` (a literal:
    ``namespace_literal``). ``limited``: some queues have ``DISPATCH["QUEUES"]``
    limits, and the statement leases none of their rows (``flow.ConcurrencyGate``
    admits them)."""
    connection = connections[db or db_alias()]
    filters = ""
    if queues:
        filters += " AND queue_name = ANY(%(queues)s)"
    if exclude:
        filters += " AND NOT (id = ANY(%(exclude)s))"
    if paused:
        filters += flow.PAUSED_FILTER_SQL
    return job_sql(connection, _CLAIM_SQL).format(
        fields=", ".join(CLAIM_FIELDS),
        above_top=TASK_MAX_PRIORITY + 1,
        filters=filters,
        namespace=namespace_literal(namespace),
        lease_filters=flow.LIMITED_FILTER_SQL if limited else "",
    )


def _claim_pg(
    db: str,
    queues: Sequence[str],
    window: int,
    exclude: Sequence[int],
    *,
    lease: int,
    worker_id: str,
    lease_seconds: float,
    namespace: str = "",
    paused: Sequence[str] = (),
    limited: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``_CLAIM_SQL``: (rows it leased, rows it only locked)."""
    sql = claim_sql(
        queues=bool(queues),
        exclude=bool(exclude),
        db=db,
        namespace=namespace,
        paused=bool(paused),
        limited=bool(limited),
    )
    params: dict[str, Any] = {
        "window": window,
        "lease": lease,
        "worker_id": worker_id,
        "lease_seconds": lease_seconds,
        "queues": list(queues),
        "exclude": list(exclude),
        "paused": list(paused),
        "limited": list(limited),
    }
    with connections[db].cursor() as cursor:
        cursor.execute(sql, params)
        records = cursor.fetchall()
    leased: list[dict[str, Any]] = []
    locked: list[dict[str, Any]] = []
    for record in records:
        row = dict(zip(_CLAIM_COLUMNS, record, strict=True))
        for name in _JSON_FIELDS:
            text = row[name]
            if isinstance(text, str):
                empty = _EMPTY_JSON.get(text)
                row[name] = empty() if empty is not None else json.loads(text)
        (leased if row.pop("leased") else locked).append(row)
    return leased, locked


def jobs_claim(
    *,
    worker_id: str,
    queues: Sequence[str],
    limit: int,
    lease_seconds: float,
    db: str | None = None,
    namespace: str = "",
    poll_interval: float = 1.0,
    placement: resources.Placement | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``limit`` runnable jobs of ``namespace`` to ``worker_id``, in claim order.

    Claim order is priority (high first), then run_after, then id. Only
    pending jobs whose run_after has passed on the database clock, in the
    given queues (empty: every queue), are eligible, and of a partition only
    its head while nothing else of it runs. Rows locked by another claimer
    are skipped, never waited for, so concurrent workers never take the same
    job. One short transaction, committed before any task code runs.

    Jobs of paused queues are left out (``flow``: the paused set is cached
    for up to ``poll_interval`` seconds, so this costs no query when fresh).

    ``placement``: a worker with capacity or a locality claims only jobs that
    fit it (``resources``, #16); None (every other worker): jobs without needs.
    """
    db = db or db_alias()
    fused = connections[db].vendor == "postgresql" and placement is None
    # savepoint=False: the worker calls this inside its own cycle transaction
    with transaction.atomic(using=db, savepoint=False):
        take_sqlite_write_lock(db)
        paused_set, waiting = flow.flow_state(db, namespace, poll_interval)
        queues, paused = flow.claimable_queues(queues, paused_set)
        if paused_set and not queues and not paused:
            return []  # every queue this worker serves is paused
        if waiting:  # concurrency groups with blocked jobs: free slots refill first
            flow.concurrency_promote(db, namespace)
        limits = queue_limits()  # DISPATCH["QUEUES"] (cached; {} on most sites)
        gate: flow.ConcurrencyGate | None = None  # made when a limited job shows up
        leased: list[dict[str, Any]] = []  # leased by _CLAIM_SQL already
        chosen: list[dict[str, Any]] = []  # runnable, lease still to write
        passed: list[int] = []  # looked at, neither claimed nor demoted
        window, demoted_total = limit, 0
        while True:
            # Our own locks are not skipped: exclude what earlier rounds took.
            seen = passed + [r["id"] for r in chosen] + [r["id"] for r in leased]
            free = limit - len(chosen) - len(leased)
            if fused:
                # Only the first round may lease unkeyed rows in the query:
                # later rounds read past demoted rows, where an unkeyed row
                # must not take the slot of a keyed head ahead of it.
                first = window == limit and not (seen or demoted_total)
                took, rows = _claim_pg(
                    db,
                    queues,
                    window,
                    seen,
                    lease=free if first else 0,
                    worker_id=worker_id,
                    lease_seconds=lease_seconds,
                    namespace=namespace,
                    paused=paused,
                    limited=sorted(limits),
                )
                leased += took
                free -= len(took)
            elif placement is not None:
                rows = resources.candidates(
                    db,
                    queues,
                    window,
                    seen,
                    namespace=namespace,
                    placement=placement,
                    fields=CLAIM_FIELDS,
                    paused=paused,
                )
            else:
                rows = runnable_candidates(
                    db, queues, window, exclude=seen, namespace=namespace, paused=paused
                )
            runnable, demoted = _sort_out_partitions(db, rows, chosen, passed, namespace)
            if any(r["concurrency_key"] is not None or r["queue_name"] in limits for r in runnable):
                gate = gate or flow.ConcurrencyGate(db, namespace, limits)
                runnable, skipped, capped = gate.sort(runnable, free)
                passed += skipped
                demoted += capped
            if placement is not None:  # only what fits, together (#16)
                runnable, unfit = placement.take(runnable, free)
                passed += unfit
            chosen += runnable[:free]
            passed += [r["id"] for r in runnable[free:]]
            demoted_total += demoted
            taken = len(chosen) + len(leased)
            if not demoted or taken >= limit or demoted_total >= DEMOTE_BUDGET:
                break
            window = max(limit - taken, DEMOTE_WINDOW)
        if not chosen and not leased:
            return []
        now: datetime = (chosen or leased)[0]["db_now"]
        if chosen:
            _lease(db, chosen, worker_id, now, lease_seconds)
    claimed = sorted(leased + chosen, key=lambda r: (-r["priority"], r["run_after"], r["id"]))
    return [_claimed(row, worker_id, now, namespace) for row in claimed]


#: ``_lease`` on PostgreSQL: the lease of rows this transaction has locked,
#: as the fused ``_CLAIM_SQL`` writes it for the rows it leases itself, in
#: raw SQL because the ORM's compilation of this UPDATE was a visible share
#: of a busy worker's claim (benchmark "mixed sizes"). ``now`` is the claim's
#: ``db_now``, as in the ORM update below (SQLite's). tests/test_raw_sql_twins.py
#: checks it, after ``runnable_candidates``, against the fused claim statement.
_LEASE_PG_SQL = """
UPDATE {job} SET
    state = {running},
    worker_id = %(worker_id)s::text,
    lease_epoch = lease_epoch + 1,
    lease_expires_at = %(now)s::timestamptz + %(lease_seconds)s * interval '1 second',
    heartbeat_at = %(now)s::timestamptz,
    attempts = attempts + 1,
    started_at = COALESCE(started_at, %(now)s::timestamptz),
    last_attempted_at = %(now)s::timestamptz,
    worker_ids = COALESCE(worker_ids, '[]'::jsonb) || jsonb_build_array(%(worker_id)s::text)
WHERE id = ANY(%(ids)s) AND state = {pending}
"""


def _lease(
    db: str, rows: list[dict[str, Any]], worker_id: str, now: datetime, lease_seconds: float
) -> None:
    """Write the lease of rows this transaction has locked: all of them, or raise."""
    ids = [r["id"] for r in rows]
    connection = connections[db]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                job_sql(connection, _LEASE_PG_SQL),
                {"ids": ids, "worker_id": worker_id, "lease_seconds": lease_seconds, "now": now},
            )
            updated = cursor.rowcount
    else:
        updated = (
            Job.objects.using(db)
            .filter(id__in=ids, state=JobState.PENDING)
            .update(
                state=JobState.RUNNING,
                worker_id=worker_id,
                lease_epoch=F("lease_epoch") + 1,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                heartbeat_at=now,
                attempts=F("attempts") + 1,
                started_at=Coalesce(F("started_at"), Value(now)),
                last_attempted_at=now,
                worker_ids=JSONAppend("worker_ids", worker_id),
            )
        )
    if updated != len(rows):  # pragma: no cover - the row locks forbid it
        raise transaction.TransactionManagementError(
            f"claim locked {len(rows)} jobs but updated {updated}; rolled back"
        )


def _sort_out_partitions(
    db: str,
    rows: list[dict[str, Any]],
    chosen: list[dict[str, Any]],
    passed: list[int],
    namespace: str = "",
) -> tuple[list[dict[str, Any]], int]:
    """Split locked candidates into runnable ones and ones to demote.

    A first look at the keys' heads, without locks, picks the runnable heads
    (leasing one takes no key lock: a key with a running job is not stalled)
    and the jobs that wait behind something. Those are demoted in this transaction by
    ``partitions_demote``, which takes their keys' locks without waiting and
    checks again under them; jobs of a busy key, or found runnable after all,
    are added to ``passed``. Returns (runnable rows, number demoted).
    """
    heads = partition_heads(db, [r["partition_key"] for r in rows if r["partition_key"]], namespace)
    taken = {r["partition_key"] for r in chosen if r["partition_key"]}
    runnable, blocked = [], []
    for row in rows:
        key = row["partition_key"]
        if key is None:
            runnable.append(row)
        elif key not in taken and heads[key].runnable(row["id"]):
            runnable.append(row)
            taken.add(key)
        else:
            blocked.append(row)
    if not blocked:
        return runnable, 0
    demoted = partitions_demote(db, [(row["id"], row["partition_key"]) for row in blocked])
    passed += [row["id"] for row in blocked if row["id"] not in demoted]
    return runnable, len(demoted)


def jobs_due_exist(
    *,
    queues: Sequence[str],
    db: str | None = None,
    namespace: str = "",
    placement: resources.Placement | None = None,
) -> bool:
    """Whether any pending job of ``namespace`` that this worker could run is due now.

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
    paused_set = frozenset(flow.queues_paused(db, namespace=namespace))
    queues, paused = flow.claimable_queues(queues, paused_set)
    if paused_set and not queues and not paused:
        return False  # every queue asked about is paused: nothing can be claimed
    if queues:
        due = due.filter(queue_name__in=list(queues))
    if paused:
        due = due.exclude(queue_name__in=paused)
    for shape in [None, *resources.shapes_could_run(db, namespace, placement)]:  # #16
        for priority in pending_priorities(db, namespace, shape):
            if due.filter(resource_shape=shape, priority=priority).exists():
                return True
    return False


def _claimed(row: dict[str, Any], worker_id: str, now: datetime, namespace: str = "") -> ClaimedJob:
    """The claimed row as it stands after the lease update (no re-read)."""
    del row["db_now"]
    row["lease_epoch"] += 1
    row["attempts"] += 1
    row["started_at"] = row["started_at"] or now
    row["last_attempted_at"] = now
    row["worker_ids"] = [*row["worker_ids"], worker_id]
    lease = Lease(
        job_id=row["id"],
        worker_id=worker_id,
        epoch=row["lease_epoch"],
        partition_key=row["partition_key"],
        namespace=namespace,
    )
    return ClaimedJob(lease=lease, row=row, claimed_at=now)
