"""A worker's whole wave as one statement: its successes, the claim that refills
their slots, in one round trip and one implicit transaction.

A wave written as a transaction takes four round trips (``BEGIN``, the
successes' ``UPDATE``, the claim, ``COMMIT``), and between them the server
session sits idle in a transaction while the worker waits for a CPU: behind
a pooler in transaction mode, 50 busy processes kept 18 of 20 pool sessions
idle that way (docs/performance.md, "Fleet"). Here the fenced finish with
its usage records, the claim's scan and its lease (the functions of
migration 0027, planned once per server session) are one statement, sent
in autocommit: PostgreSQL runs it as its own transaction, so the successes
and the leases commit together, or neither, as in
``BatchCompleter.write_wave``'s transaction.

It is the plain case only, and the caller (``runtime.completer``) knows when
that is: no success of the wave holds a partition key (a freed key needs its
lock before the finish and a promotion after it), no placement, no queue
limits, no concurrency group waiting, no staging due. The claim leases the
unkeyed candidates only, exactly as the fused claim's first round does;
keyed candidates (a partition, a concurrency or rate limit) are only locked,
and those locks end with the statement, so the result says how many were
passed (``WaveResult.passed``), for the caller to claim them through the
gates in a transaction of their own. The claim does not see the finish's
rows (running, never pending), and nothing in the plain case depends on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction

from .base import hot_cursor, job_sql
from .finish import MeasuredUsage, finish_params
from .leasing import claimed_job
from .partitions import lock_partitions, partitions_promote
from .sources.fused_pg import claim_sql, claimed_rows
from .types import ClaimedJob, Lease

#: The finish of the wave's successes and their usage records: the function
#: of migration 0027 (``django_dispatch_finish_wave``), whose statements are
#: planned once per server session: its UPDATE reaches the job table by
#: primary key only, so the generic plan is the plan. It returns one row: the
#: winners' ids (``won``) and the partition keys they freed (``freed``), each
#: NULL for none. Without usage records the usage arrays are NULL (no record).
#: The casts pick the function's signature.
_FINISH_CALL = (
    "django_dispatch_finish_wave(%(ids)s::bigint[], %(workers)s::text[],"
    " %(epochs)s::bigint[], %(values)s::jsonb[], %(metered)s::boolean[],"
    " %(walls)s::float8[], %(cpus)s::float8[], %(rss)s::float8[], %(host)s::text,"
    " %(outcome)s::text)"
)
#: The lease of the claim's unkeyed candidates: the function of migration
#: 0027 (``django_dispatch_lease_wave``, ``leasing``'s SET list by primary
#: key, planned once per server session), given the ids ``candidates`` locked
#: and the claim's clock. One row, whatever the candidates.
_LEASE_CALL = """(
    SELECT django_dispatch_lease_wave(
        array_agg(id) FILTER (WHERE partition_key IS NULL AND concurrency_key IS NULL),
        %(worker_id)s::text, %(lease_seconds)s::float8, max(db_now)) AS leased
    FROM candidates
)"""
#: The wave: the finish (``_FINISH_CALL``, ``f``), ``candidates`` (the claim's
#: scan, ``_CANDIDATES_CTE``) and the lease of its unkeyed rows
#: (``_LEASE_CALL``, ``l``); one row per candidate, the winners and the keys
#: they freed on every row, and one row (the candidate's columns NULL) when
#: the claim found none.
#:
#: The claim here always leases every unkeyed candidate (its window is its
#: lease: no queue limits in the plain case), so the lease takes them all
#: straight from ``candidates``, which has them locked, without the fused
#: claim's ORDER BY and LIMIT, and whether a row was leased is what its keys
#: say. ``candidates`` is materialized once, before the lease writes: its
#: rows are the values from before the lease (``leasing.claimed_job``
#: applies it). Only the claim's scan is planned on every wave (its plan
#: depends on the data); each plan node less is planning time saved.
#:
#: Each function's statement takes its own snapshot, the claim's scan as
#: well (a volatile function). The finish writes running rows, the claim reads
#: and leases pending ones: neither depends on the other.
#: The claim's candidates: ``sources.fused_pg.CANDIDATES_CTE``'s scan, by
#: the function of migration 0027 (``django_dispatch_claim_scan``: the same
#: filters, its plan the ordered scan of the claim index, made once per server
#: session), the columns the claim reads taken from its rows.
_CANDIDATES_CTE = """
candidates AS MATERIALIZED (
    SELECT {fields}, now() AS db_now
    FROM django_dispatch_claim_scan({namespace}, %(window)s::integer, %(queues)s::text[],
        %(paused)s::text[])
)"""
_WAVE_SQL = (
    """
WITH {candidates}
SELECT f.won, f.freed, c.*, c.partition_key IS NULL AND c.concurrency_key IS NULL
FROM """
    + _FINISH_CALL
    + " AS f CROSS JOIN "
    + _LEASE_CALL
    + """ AS l LEFT JOIN candidates AS c ON true
ORDER BY c.priority DESC, c.run_after, c.id
"""
).replace("{candidates}", _CANDIDATES_CTE)
#: The wave without a claim (no slot to fill).
_FINISH_ONLY_SQL = "SELECT won, freed FROM " + _FINISH_CALL
#: The function's usage parameters when the wave writes no usage record.
_NO_USAGE = {
    "metered": None,
    "walls": None,
    "cpus": None,
    "rss": None,
    "host": None,
    "outcome": None,
}


@dataclass(frozen=True, slots=True)
class WaveClaim:
    """What the wave's claim takes: up to ``limit`` jobs for ``worker_id``."""

    worker_id: str
    limit: int
    lease_seconds: float
    namespace: str = ""
    queues: Sequence[str] = ()
    #: Paused queues among those served (``flow.claimable_queues``).
    paused: Sequence[str] = ()


@dataclass(slots=True)
class WaveResult:
    """What the wave's statement did, once it committed."""

    won: set[int] = field(default_factory=set)
    claimed: list[ClaimedJob] = field(default_factory=list)
    #: Candidates the claim locked but could not lease (keyed: the gates decide).
    passed: int = 0
    #: Partition keys its winners freed that their leases did not carry: promote
    #: them (``wave_promote_freed``) once the statement has committed.
    freed: set[str] = field(default_factory=set)
    namespace: str = ""


def jobs_finish_many_and_claim(
    results: Sequence[tuple[Lease, Any]],
    *,
    db: str,
    claim: WaveClaim | None,
    usage: MeasuredUsage | None = None,
) -> WaveResult:
    """running -> succeeded for ``results`` (fenced, with the winners' ``usage``) and
    the claim of ``claim.limit`` unkeyed jobs, in one statement on PostgreSQL.

    Run outside a transaction, it is one: the successes and the leases commit
    together. ``results`` must hold no partitioned job (see the module); a
    winner whose lease did not carry its key has its partition promoted after
    the commit, under the key's lock.
    """
    connection = connections[db]
    template = _WAVE_SQL if claim is not None and claim.limit > 0 else _FINISH_ONLY_SQL
    params = finish_params(results, usage)
    if not usage:
        params.update(_NO_USAGE)
    if claim is not None and claim.limit > 0:
        sql = claim_sql(
            queues=bool(claim.queues),
            exclude=False,
            db=db,
            namespace=claim.namespace,
            paused=bool(claim.paused),
            template=template,
        )
        params.update(
            window=claim.limit,
            worker_id=claim.worker_id,
            lease_seconds=claim.lease_seconds,
            queues=list(claim.queues) or None,  # NULL: every queue
            paused=list(claim.paused) or None,
        )
    else:
        sql = job_sql(connection, template)
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        records = cursor.fetchall()
    won, freed = records[0][0], records[0][1]
    result = WaveResult(won=set(won or ()))
    if claim is not None and claim.limit > 0 and records[0][2] is not None:
        leased, locked = claimed_rows(records, skip=2)
        result.passed = len(locked)
        if leased:
            now: datetime = leased[0]["db_now"]
            result.claimed = [
                claimed_job(row, claim.worker_id, now, claim.namespace) for row in leased
            ]
    if freed:  # a lease built without its key: promoted after the commit, under the lock
        result.freed, result.namespace = set(freed), results[0][0].namespace
    return result


def wave_promote_freed(result: WaveResult, *, db: str) -> None:
    """Promote the next job of each partition ``result``'s winners freed, under
    the keys' locks. Separate from the wave: the wave has committed by then,
    so a failure here must not be taken for the wave's (its successes are
    written, its claims leased); the leader's sweep promotes a stalled
    partition (``partitions_promote_stalled``) if this never runs."""
    if result.freed:
        with transaction.atomic(using=db):
            lock_partitions(db, result.freed)
            partitions_promote(db, result.freed, result.namespace)
