"""A worker's whole wave as one statement: its successes, the claim that refills
their slots, in one round trip and one implicit transaction.

A wave written as a transaction takes four round trips (``BEGIN``, the
successes' ``UPDATE``, the claim, ``COMMIT``), and between them the server
session sits idle in a transaction while the worker waits for a CPU: behind
a pooler in transaction mode, 50 busy processes kept 18 of 20 pool sessions
idle that way (docs/performance.md, "Fleet"). Here the fenced finish of
``store.finish`` (with its usage records) and the fused claim of
``sources.fused_pg`` are data-modifying CTEs of one statement, sent in
autocommit: PostgreSQL runs it as its own transaction, so both commit
together, or neither, as in ``BatchCompleter.write_wave``'s transaction.

It is the plain case only, and the caller (``runtime.completer``) knows when
that is: no success of the wave holds a partition key (a freed key needs its
lock before the finish and a promotion after it), no placement, no queue
limits, no concurrency group waiting, no staging due. The claim leases the
unkeyed candidates only, exactly as the fused claim's first round does;
keyed candidates (a partition, a concurrency or rate limit) are only locked,
and those locks end with the statement, so the result says how many were
passed (``WaveResult.passed``), for the caller to claim them through the
gates in a transaction of their own. The CTEs share one snapshot: the claim
does not see the finish's rows (running, never pending), and nothing in the
plain case depends on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction

from .base import hot_cursor, job_sql
from .finish import _FINISH_MANY_SQL, FINISHED_USAGE_ROWS, finish_params
from .leasing import claimed_job
from .partitions import lock_partitions, partitions_promote
from .sources.fused_pg import _CLAIM_CTES, CLAIMED_ROWS_SQL, claimed_rows
from .types import CLAIM_FIELDS, ClaimedJob, Lease
from .usage import UsageEntry, usage_insert_sql

#: The wave: ``done`` (the fenced finish, returning its winners), ``recorded``
#: (their usage records: none when the array is NULL), then the claim's CTEs;
#: one row per candidate, the winners and the keys they freed on every row,
#: and one row (the candidate's columns NULL) when the claim found none. The
#: body of the function ``WAVE_FUNCTION``, which runs it.
_WAVE_SQL = """
WITH done AS ({finish}),
recorded AS ({insert}),{claim}
SELECT w.won, w.freed, c.*
FROM (
    SELECT array_agg(id) AS won,
        array_agg(DISTINCT partition_key::text) FILTER (WHERE partition_key IS NOT NULL) AS freed
    FROM done
) AS w LEFT JOIN ({claimed}) AS c ON true
ORDER BY c.priority DESC, c.run_after, c.id
"""


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


def jobs_finish_many_and_claim(
    results: Sequence[tuple[Lease, Any]],
    *,
    db: str,
    claim: WaveClaim,
    usage: Mapping[int, UsageEntry] | None = None,
) -> WaveResult:
    """running -> succeeded for ``results`` (fenced, with the winners' ``usage``) and
    the claim of ``claim.limit`` unkeyed jobs, in one statement on PostgreSQL.

    Run outside a transaction, it is one: the successes and the leases commit
    together. ``results`` must hold no partitioned job (see the module); a
    winner whose lease did not carry its key has its partition promoted after
    the commit, under the key's lock.
    """
    params = finish_params(results, usage)
    params.setdefault("usage", None)
    params.update(
        window=claim.limit,
        worker_id=claim.worker_id,
        lease_seconds=claim.lease_seconds,
        namespace=claim.namespace,
        queues=list(claim.queues),
        paused=list(claim.paused),
    )
    with hot_cursor(connections[db]) as cursor:
        cursor.execute(_CALL_SQL, params)
        records = cursor.fetchall()
    won, freed = records[0][0], records[0][1]
    result = WaveResult(won=set(won or ()))
    if records[0][2] is not None:
        leased, locked = claimed_rows(records, skip=2)
        result.passed = len(locked)
        if leased:
            now: datetime = leased[0]["db_now"]
            result.claimed = [
                claimed_job(row, claim.worker_id, now, claim.namespace) for row in leased
            ]
    if freed:  # a lease built without its key: promote after the commit, under the lock
        with transaction.atomic(using=db):
            lock_partitions(db, set(freed))
            partitions_promote(db, set(freed), results[0][0].namespace)
    return result


#: The wave's PL/pgSQL function (migration 0024): the same statement, whose
#: plans PostgreSQL keeps per session. Planning the statement was about 45%
#: of its server time (``EXPLAIN ANALYZE``: 0.39 of 0.87 ms for a wave of 8),
#: paid on every wave; psycopg's prepared statements would keep the plan too,
#: but PgBouncer before 1.21 cannot pass them in transaction mode. A
#: function's plans live inside the server session, where a pooler never
#: looks. ``force_generic_plan``: one plan for every wave, never re-planned
#: for its parameters (the claim's plan does not depend on them: one ordered
#: scan of the claim index, see ``sources.fused_pg``).
WAVE_FUNCTION = "django_dispatch_wave"
#: ``_WAVE_SQL``'s parameters, as the function names them.
_FUNCTION_PARAMS = {
    "%(ids)s": "p_ids",
    "%(workers)s": "p_workers",
    "%(epochs)s": "p_epochs",
    "%(values)s": "p_values",
    "%(usage)s": "p_usage",
    "%(worker_id)s": "p_worker_id",
    "%(lease_seconds)s": "p_lease_seconds",
    "%(window)s": "p_window",
    "%(lease)s": "p_window",
}
_FUNCTION_SQL = """CREATE OR REPLACE FUNCTION {name}(
    p_ids bigint[], p_workers text[], p_epochs bigint[], p_values jsonb[], p_usage jsonb,
    p_worker_id text, p_lease_seconds double precision, p_window integer,
    p_namespace text, p_queues text[], p_paused text[]
) RETURNS TABLE (won bigint[], freed text[], {columns}, db_now timestamptz, leased boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan
AS $wave$
#variable_conflict use_column
BEGIN
RETURN QUERY {body};
END
$wave$"""
#: The claim's filters in the function: every queue when ``p_queues`` is empty.
_FUNCTION_FILTERS = (
    " AND (cardinality(p_queues) = 0 OR queue_name = ANY(p_queues))"
    " AND NOT (queue_name = ANY(p_paused))"
)
#: The function's call: its rows are ``_WAVE_SQL``'s.
_CALL_SQL = (
    f"SELECT * FROM {WAVE_FUNCTION}(%(ids)s::bigint[], %(workers)s::text[],"
    " %(epochs)s::bigint[], %(values)s::jsonb[], %(usage)s::jsonb, %(worker_id)s::text,"
    " %(lease_seconds)s::float8, %(window)s::integer, %(namespace)s::text,"
    " %(queues)s::text[], %(paused)s::text[])"
)


def wave_function_sql(connection: Any) -> str:
    """``CREATE OR REPLACE FUNCTION`` of the wave for ``connection``'s database, from
    ``_WAVE_SQL`` and the models' column types (migration 0024; a test holds the
    installed function to this text)."""
    from ..models import Job

    body = _WAVE_SQL.format(
        finish=_FINISH_MANY_SQL.strip(),
        insert=usage_insert_sql(connection, FINISHED_USAGE_ROWS).strip(),
        claim=_CLAIM_CTES,
        claimed=CLAIMED_ROWS_SQL.strip(),
    )
    body = job_sql(connection, body).format(
        fields=", ".join(CLAIM_FIELDS),
        filters=_FUNCTION_FILTERS,
        namespace="p_namespace",
        lease_filters="",
    )
    for param, name in _FUNCTION_PARAMS.items():
        body = body.replace(param, name)
    columns = ", ".join(
        f"{name} {Job._meta.get_field(name).db_type(connection)}" for name in CLAIM_FIELDS
    )
    return _FUNCTION_SQL.format(name=WAVE_FUNCTION, columns=columns, body=body.strip())
