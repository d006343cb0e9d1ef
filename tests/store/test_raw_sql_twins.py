"""Each raw SQL statement of the store does what its ORM twin does, on the same rows.

On PostgreSQL the store runs raw SQL on its hot paths (the fused claim, the
finish-many wave, the enqueue inserts) and the ORM elsewhere; the choice is a
vendor check (``connection.vendor == "postgresql"``), so a PostgreSQL run of
the suite never takes the ORM path and a SQLite run never the raw one. Here
both paths run on PostgreSQL, on the same rows: each in a transaction rolled
back after reading what it did, and the outcomes (what it returned, which
rows it changed and how) are compared.

Time: raw SQL's ``now()`` is the transaction's start, the ORM's ``Now()`` the
statement's (``STATEMENT_TIMESTAMP()``), so the two never write the same
instant. Timestamps a path wrote are compared as offsets from its own clock
(the claim's ``db_now``, the wave's ``finished_at``); those it left alone are
compared as they are.

The partition statements (heads, demote, promote, stalled keys, the lock of a
job's key) have **no ORM twin**: the ORM cannot join a list of keys to
correlated subqueries, so they exist only as raw SQL, the same text on both
engines. Their case compares each with an expectation computed by hand from
the rows it starts with.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.utils import timezone

from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.store.base import db_now
from django_dispatch.store.enqueue import (
    job_insert_call,
    jobs_insert,
    jobs_insert_calls,
)
from django_dispatch.store.finish import _finish_many_orm, _finish_many_pg
from django_dispatch.store.leasing import claimed_job, jobs_lease
from django_dispatch.store.partitions import (
    LOCK_CLASS,
    Head,
    lock_partition_of_job,
    partition_heads,
    partitions_demote,
    partitions_promote,
    partitions_promote_stalled,
)
from django_dispatch.store.sources.fused_pg import claim_pg
from django_dispatch.store.sources.orm import runnable_candidates
from django_dispatch.store.types import CallChunk, JobSpec, Lease
from tests.conftest import postgres_only

# Committed set-up rows: each path then runs in a transaction of its own, so
# its clock starts after them.
pytestmark = [postgres_only, pytest.mark.django_db(transaction=True)]

DB = "default"
TASK = "tests.testapp.tasks.add"
#: JSON that is easy to get wrong between json.dumps + ::jsonb and the ORM.
AWKWARD = [
    {"nested": {"list": [1, [2, {"deep": None}]], "empty": {}, "e": []}},
    'héllo ✓ 漢字 🎉 quote " backslash \\ newline \n',
    2**70,
    -0.25,
    None,
    [],
]


def _snapshot() -> dict[int, dict[str, Any]]:
    """Every job row, by id; ``return_value_is_sql_null`` tells SQL NULL from JSON null."""
    rows = Job.objects.using(DB).annotate(
        return_value_is_sql_null=ExpressionWrapper(
            Q(return_value__isnull=True), output_field=BooleanField()
        )
    )
    return {row["id"]: row for row in rows.values()}


def _relative(value: Any, clock: datetime) -> Any:
    """``value`` with each datetime as its offset from ``clock``."""
    if isinstance(value, datetime):
        return ("clock +", value - clock)
    if isinstance(value, dict):
        return {k: _relative(v, clock) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_relative(v, clock) for v in value]
    return value


def _changes(
    before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]]
) -> dict[int, dict[str, Any]]:
    """{job id: {column: new value}} for every column a path changed."""
    assert after.keys() == before.keys()
    changed = {}
    for job_id, row in after.items():
        diff = {k: v for k, v in row.items() if before[job_id][k] != v}
        if diff:
            changed[job_id] = diff
    return changed


def _on_the_same_rows(*paths: Callable[[], Any]) -> list[tuple[Any, dict[int, dict[str, Any]]]]:
    """Run each path on the rows as they stand: [(its result, the rows after it)].

    Each path runs in a transaction that is rolled back once its outcome is
    read, so the next one starts from exactly the same rows.
    """
    before = _snapshot()
    outcomes = []
    for path in paths:
        with transaction.atomic(using=DB):
            result = path()
            outcomes.append((result, _snapshot()))
            transaction.set_rollback(True, using=DB)
        assert _snapshot() == before  # really rolled back
    return outcomes


def _jobs(*specs: dict[str, Any]) -> list[int]:
    """Insert job rows as given (any state: the transition guard checks updates only)."""
    jobs = [Job(task_path=TASK, args=[1, 2], **spec) for spec in specs]
    return [job.pk for job in Job.objects.using(DB).bulk_create(jobs)]


# --- claim: claim_pg (the fused statement) vs runnable_candidates + jobs_lease -----------

WORKER = "twin-worker"
LEASE_SECONDS = 30.0


def _claim_order(row: dict[str, Any]) -> tuple[Any, ...]:
    return (-row["priority"], row["run_after"], row["id"])


def _claim_case() -> None:
    now = db_now(DB)
    past, future = now - timedelta(minutes=1), now + timedelta(hours=1)
    (
        urgent_head,
        second,
        other_head,
        retry,
        first,
        tie,
        behind,
        low,
        excluded,
        elsewhere,
        later,
        later_urgent,
        blocked,
    ) = _jobs(
        {"partition_key": "A", "priority": 9, "run_after": past},
        {"priority": 5, "run_after": past},
        {"partition_key": "B", "priority": 1, "run_after": past},
        # a retry: its started_at, worker_ids, errors and checkpoint are kept
        {
            "queue_name": "q2",
            "run_after": past - timedelta(seconds=30),
            "attempts": 1,
            "max_attempts": 3,
            "started_at": past - timedelta(minutes=5),
            "worker_ids": ["old"],
            "errors": [{"exception_class_path": "x.Y", "message": "m", "traceback": "t"}],
            "checkpoint": {"at": 3},
            "lease_epoch": 4,
        },
        {"run_after": past},
        # same run_after as `first`: the id decides, up to the window's end
        {"run_after": past},
        {"partition_key": "A", "run_after": past},  # beyond the window
        {"priority": -5, "run_after": past},  # beyond the window
        {"run_after": past},  # excluded by the caller
        {"queue_name": "elsewhere", "run_after": past},
        {"run_after": future},
        {"priority": 7, "run_after": future},  # a priority with deferred jobs only
        {"partition_key": "A", "state": JobState.BLOCKED, "run_after": past},
    )
    _jobs(
        {"state": JobState.RUNNING, "worker_id": "w", "run_after": past},
        {"state": JobState.SUCCEEDED, "run_after": past},
    )
    queues, exclude, window, lease = ["default", "q2"], [excluded], 6, 3

    def raw() -> tuple[list[dict[str, Any]], list[int]]:
        leased, locked = claim_pg(
            DB,
            queues,
            window,
            exclude,
            lease=lease,
            worker_id=WORKER,
            lease_seconds=LEASE_SECONDS,
        )
        return sorted(leased + locked, key=_claim_order), [r["id"] for r in leased]

    def orm() -> tuple[list[dict[str, Any]], list[int]]:
        rows = runnable_candidates(DB, queues, window, exclude=exclude)
        # What the fused statement leases: the first `lease` unkeyed candidates.
        chosen = [r for r in rows if r["partition_key"] is None][:lease]
        jobs_lease(DB, chosen, WORKER, rows[0]["db_now"], LEASE_SECONDS)
        return rows, [r["id"] for r in chosen]

    before = _snapshot()
    outcomes = []
    for (rows, leased), after in _on_the_same_rows(raw, orm):
        clock = rows[0]["db_now"]
        assert all(row["db_now"] == clock for row in rows)
        assert clock >= now  # its own clock, not a set-up value
        claimed = []
        for row in rows:
            if row["id"] in leased:
                job = claimed_job(dict(row), WORKER, clock)
                # what the claim wrote is at its clock; the rest as it was
                row_at = {k: "clock" if v == clock else v for k, v in job.row.items()}
                claimed.append((job.lease, row_at, job.claimed_at - clock))
        candidates = [{k: v for k, v in row.items() if k != "db_now"} for row in rows]
        changes = {i: _relative(c, clock) for i, c in _changes(before, after).items()}
        outcomes.append((candidates, leased, claimed, changes))
    (raw_outcome, orm_outcome) = outcomes
    # The rows each path locked, in claim order, with their values from before.
    assert [r["id"] for r in raw_outcome[0]] == [urgent_head, second, other_head, retry, first, tie]
    assert raw_outcome[0] == orm_outcome[0]
    # The rows each leased, and the ClaimedJob each hands the worker.
    assert raw_outcome[1] == orm_outcome[1] == [second, retry, first]
    assert raw_outcome[2] == orm_outcome[2]
    # What each changed in the table, column by column.
    assert raw_outcome[3] == orm_outcome[3]
    lease_change = {
        "state": JobState.RUNNING,
        "worker_id": WORKER,
        "lease_expires_at": ("clock +", timedelta(seconds=LEASE_SECONDS)),
        "heartbeat_at": ("clock +", timedelta(0)),
        "last_attempted_at": ("clock +", timedelta(0)),
    }
    assert raw_outcome[3][retry] == {
        **lease_change,
        "attempts": 2,
        "lease_epoch": 5,
        "worker_ids": ["old", WORKER],
    }
    assert raw_outcome[3].keys() == {second, retry, first}
    # in the table, out of every claim above
    del behind, low, later, later_urgent, blocked, elsewhere


# --- finish many: _finish_many_pg vs _finish_many_orm ------------------------------


def _finish_many_case() -> None:
    running = {
        "state": JobState.RUNNING,
        "worker_id": WORKER,
        "lease_epoch": 2,
        "lease_expires_at": timezone.now() + timedelta(seconds=LEASE_SECONDS),
    }
    won, won_keyed, won_none, won_awkward, stale, other, cancelled = _jobs(
        running,
        {**running, "partition_key": "K"},
        running,
        running,
        {**running, "lease_epoch": 3},  # claimed again since: the lease is stale
        {**running, "worker_id": "someone-else"},
        {**running, "state": JobState.CANCELLED, "lease_expires_at": timezone.now()},
    )
    results = [
        (Lease(won, WORKER, 2), {"nested": ["ü", 2**40, None]}),
        (Lease(won_keyed, WORKER, 2, "K"), 7),
        (Lease(won_none, WORKER, 2), None),  # SQL NULL, not JSON null
        (Lease(won_awkward, WORKER, 2), AWKWARD),
        (Lease(stale, WORKER, 2), "lost"),
        (Lease(other, WORKER, 2), "lost"),
        (Lease(cancelled, WORKER, 2), "lost"),
    ]
    before = _snapshot()
    outcomes = []
    for winners, after in _on_the_same_rows(
        lambda: _finish_many_pg(results, DB), lambda: _finish_many_orm(results, DB)
    ):
        changes = _changes(before, after)
        (clock,) = {c["finished_at"] for c in changes.values()}  # one statement, one clock
        outcomes.append((winners, {i: _relative(c, clock) for i, c in changes.items()}))
    (raw_winners, raw_changes), (orm_winners, orm_changes) = outcomes
    assert (
        raw_winners == orm_winners == {won: None, won_keyed: "K", won_none: None, won_awkward: None}
    )
    assert raw_changes == orm_changes
    assert raw_changes[won_none] == {
        "state": JobState.SUCCEEDED,
        "finished_at": ("clock +", timedelta(0)),
        "lease_expires_at": None,
    }  # return_value stays SQL NULL
    assert raw_changes[won_awkward]["return_value"] == AWKWARD
    assert raw_changes[won_awkward]["return_value_is_sql_null"] is False


# --- enqueue: job_insert_call / jobs_insert_calls vs jobs_insert -----------------------


def _spec(deferred: bool) -> JobSpec:
    return JobSpec.of(
        task_path=TASK,
        backend="default",
        queue_name="q2",
        priority=-3,
        deferred_until=timezone.now() + timedelta(hours=2) if deferred else None,
        partition_key="P",
        idempotency_key=None,
        max_attempts=4,
    )


def _inserted(ids: list[int], enqueued: list[datetime]) -> list[dict[str, Any]]:
    """The rows ``ids``, less what differs between two fresh jobs (id, clock)."""
    rows = _snapshot()
    inserted = []
    for job_id, enqueued_at in zip(ids, enqueued, strict=True):
        row = dict(rows[job_id])
        assert row["enqueued_at"] == enqueued_at  # what the insert returned
        deferred_until = row["deferred_until"]
        assert row["run_after"] == (deferred_until or enqueued_at)
        for name in ("id", "enqueued_at", "run_after"):
            del row[name]
        inserted.append(row)
    return inserted


def _enqueue_case() -> None:
    for deferred in (False, True):
        _enqueue_both_ways(_spec(deferred))


def _enqueue_both_ways(spec: JobSpec) -> None:
    args, kwargs = [AWKWARD, 1], {"k": AWKWARD[0]}
    calls = [[[i, value], {"v": value}] for i, value in enumerate(AWKWARD)]

    def raw_one() -> list[dict[str, Any]]:
        job_id, enqueued_at = job_insert_call(
            spec, args, kwargs, json.dumps(args), json.dumps(kwargs), db=DB
        )
        return _inserted([job_id], [enqueued_at])

    def orm_one() -> list[dict[str, Any]]:
        job = spec.new_job(args, kwargs)
        jobs_insert([job], db=DB)
        return _inserted([job.pk], [job.enqueued_at])

    def raw_many() -> list[dict[str, Any]]:
        chunks = [  # two statements
            CallChunk(json.dumps(calls[:4]), calls[:4]),
            CallChunk(json.dumps(calls[4:]), calls[4:]),
        ]
        return _inserted(*jobs_insert_calls(spec, chunks, db=DB))

    def orm_many() -> list[dict[str, Any]]:
        jobs = jobs_insert([spec.new_job(a, k) for a, k in calls], db=DB)
        return _inserted([j.pk for j in jobs], [j.enqueued_at for j in jobs])

    (raw_rows, _), (orm_rows, _) = _on_the_same_rows(raw_one, orm_one)
    assert raw_rows == orm_rows
    # Deferred to later: scheduled, out of the claim index, either way.
    state = JobState.SCHEDULED if spec.deferred_until is not None else JobState.PENDING
    assert raw_rows[0]["args"] == [AWKWARD, 1] and raw_rows[0]["state"] == state
    (raw_rows, _), (orm_rows, _) = _on_the_same_rows(raw_many, orm_many)
    assert raw_rows == orm_rows  # in call order
    assert [row["kwargs"] for row in raw_rows] == [{"v": value} for value in AWKWARD]


# --- partitions: no ORM twin, hand-computed expectations ---------------------------


def _partitions_case() -> None:
    """Heads, demote, promote, stalled keys and the job-key lock: raw SQL only.

    Keys: A blocked head, nothing active (stalled); B pending head, a blocked
    and a pending job behind; C running head, blocked and pending behind; D a
    finished job then a blocked one (its head, stalled); E a blocked head not
    named to the promotion (stalled); F a cancelled job still held, then a
    blocked and a pending one; G one pending job.
    """
    blocked, pending = {"state": JobState.BLOCKED}, {"state": JobState.PENDING}
    held = {"state": JobState.CANCELLED, "worker_id": "w", "lease_expires_at": timezone.now()}
    a1, b1, b2, b3, c1, c2, c3, _d0, d1, e1, f0, f1, f2, g1, free = _jobs(
        {**blocked, "partition_key": "A"},
        {**pending, "partition_key": "B"},
        {**blocked, "partition_key": "B"},
        {**pending, "partition_key": "B"},
        {"state": JobState.RUNNING, "worker_id": "w", "partition_key": "C"},
        {**blocked, "partition_key": "C"},
        {**pending, "partition_key": "C"},
        {"state": JobState.SUCCEEDED, "partition_key": "D"},
        {**blocked, "partition_key": "D"},
        {**blocked, "partition_key": "E"},
        {**held, "partition_key": "F"},
        {**blocked, "partition_key": "F"},
        {**pending, "partition_key": "F"},
        {**pending, "partition_key": "G"},
        pending,
    )
    assert partition_heads(DB, list("ABCDEFG")) == {
        "A": Head(a1, None),
        "B": Head(b1, None),
        "C": Head(c1, c1),
        "D": Head(d1, None),
        "E": Head(e1, None),
        "F": Head(f1, f0),
        "G": Head(g1, None),
    }

    def states() -> dict[int, str]:
        return dict(Job.objects.using(DB).values_list("id", "state"))

    start = states()

    def demote() -> set[int]:
        return partitions_demote(DB, [(b3, "B"), (c3, "C"), (f2, "F"), (g1, "G")])

    def promote() -> int:
        return partitions_promote(DB, ["A", "B", "C", "D", "F", None])

    def held_locks(key: str | None) -> int:
        """Partition locks this connection holds: ``key``'s, or all when None."""
        sql = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND pid = pg_backend_pid() AND classid = %s::oid AND objsubid = 2"
        )
        with connection.cursor() as cursor:
            if key is None:
                cursor.execute(sql, [LOCK_CLASS])
            else:
                cursor.execute(sql + " AND objid = hashtext(%s)::oid", [LOCK_CLASS, key])
            return cursor.fetchone()[0]

    def locks() -> list[int]:
        lock_partition_of_job(DB, c1)
        taken = [held_locks("C")]
        lock_partition_of_job(DB, free)
        return [*taken, held_locks(None)]

    outcomes = _on_the_same_rows(demote, promote, lambda: partitions_promote_stalled(DB), locks)
    (demoted, after_demote), (promoted, after_promote), (swept, after_sweep), (taken, _) = outcomes
    assert demoted == {b3, c3, f2}  # g1 is runnable: left pending
    assert {i: r["state"] for i, r in after_demote.items() if r["state"] != start[i]} == {
        b3: JobState.BLOCKED,
        c3: JobState.BLOCKED,
        f2: JobState.BLOCKED,
    }
    # Each named key's oldest live job, if blocked: A's, D's and F's (a held
    # cancelled job is not live; the claim checks it again before running f1).
    assert promoted == 3
    assert {i: r["state"] for i, r in after_promote.items() if r["state"] != start[i]} == {
        a1: JobState.PENDING,
        d1: JobState.PENDING,
        f1: JobState.PENDING,
    }
    # Stalled: a blocked job and nothing active (A, B, D, E); B's head is pending.
    assert swept == 3
    assert {i: r["state"] for i, r in after_sweep.items() if r["state"] != start[i]} == {
        a1: JobState.PENDING,
        d1: JobState.PENDING,
        e1: JobState.PENDING,
    }
    assert taken == [1, 1]  # C's lock, by its job; then an unkeyed job's: none more
    del b2, c2


CASES = {
    "claim": _claim_case,
    "finish_many": _finish_many_case,
    "enqueue": _enqueue_case,
    "partitions_no_twin": _partitions_case,
}


@pytest.mark.parametrize("statement", sorted(CASES))
def test_each_raw_statement_does_what_its_orm_twin_does_on_the_same_rows(statement):
    CASES[statement]()
