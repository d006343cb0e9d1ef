"""The fused PostgreSQL claim source: the claim's scan and the lease in one statement.

The claim is the hot path of every worker, and compiling two ORM statements
per claim cost more CPU than running them (see docs/performance.md), so on
PostgreSQL the scan of ``sources.orm.runnable_candidates`` and the lease of
its unkeyed rows are one statement. tests/store/test_raw_sql_twins.py runs it
beside the ORM source plus ``leasing.jobs_lease`` on the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from django.db import connections

from ..base import db_alias, hot_cursor, job_sql, namespace_literal
from ..flow import PAUSED_FILTER_SQL
from ..gates.limits import LIMITED_FILTER_SQL
from ..leasing import lease_set_sql
from ..types import CLAIM_FIELDS

#: The claim's candidates, for PostgreSQL: one ordered scan of the partial
#: index ``dispatch_job_claim`` (namespace, priority desc, run_after, id;
#: pending jobs without needs), locking due rows in claim order until it has
#: ``%(window)s``. Jobs deferred to later are not in that index: they wait as
#: ``scheduled`` until the stager makes them pending (``store.staging``), so
#: the scan reads no deferred job and needs no walk of the priorities.
#: ``run_after <= now()`` stays as a filter, checked in the index: a job
#: written as pending by a client whose clock runs ahead of the database's
#: is not claimed before it is due by the database's clock. The LIMIT stops
#: the scan as soon as the window is locked (MATERIALIZED: locked once, read
#: twice). Served by the partial index ``dispatch_job_claim``, like the ORM
#: query (tests/store/test_claim.py checks the plan).
CANDIDATES_CTE = """
candidates AS MATERIALIZED (
    SELECT {fields}, now() AS db_now
    FROM {job}
    WHERE namespace = {namespace} AND state = {pending} AND resource_shape IS NULL
        AND run_after <= now() {filters}
    ORDER BY priority DESC, run_after, id
    LIMIT %(window)s
    FOR UPDATE SKIP LOCKED
)"""
#: ``runnable_candidates`` plus the lease of its unkeyed rows, for PostgreSQL.
#:
#: ``leased`` takes the first ``%(lease)s`` unkeyed candidates and writes their
#: lease with ``leasing``'s SET list, exactly as ``jobs_lease`` would. Keyed
#: candidates stay locked but untouched: the partition rules decide about
#: them in Python. Every row comes back, in claim order whatever the plan,
#: with its values from before the update (``leasing.claimed_job`` applies the
#: lease to them) and whether this statement leased it. Table and states come
#: from the models (``job_sql``); tests/store/test_raw_sql_twins.py runs it
#: beside the ORM path on the same rows.
_CLAIM_CTES = (
    CANDIDATES_CTE
    + """, leased AS (
    UPDATE {job} AS j SET{lease_set}
    FROM (
        SELECT id, db_now FROM candidates WHERE partition_key IS NULL AND concurrency_key IS NULL
        {lease_filters} ORDER BY priority DESC, run_after, id LIMIT %(lease)s
    ) AS c
    WHERE j.id = c.id
    RETURNING j.id
)""".replace("{lease_set}", lease_set_sql(row="j.", now="c.db_now"))
)
#: The candidates in claim order, each with whether the statement leased it.
CLAIMED_ROWS_SQL = """
SELECT candidates.*, leased.id IS NOT NULL AS leased
FROM candidates LEFT JOIN leased ON leased.id = candidates.id"""
_CLAIM_SQL = (
    "WITH"
    + _CLAIM_CTES
    + CLAIMED_ROWS_SQL
    + "\nORDER BY candidates.priority DESC, candidates.run_after, candidates.id\n"
)
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
    "call_context",
    "resources",
)
#: The JSON texts most claimed rows carry (no arguments, no errors yet), built
#: without the parser: a fresh object each, since callers may change them.
#: Parsing them was most of the claim's per-row Python cost.
_EMPTY_JSON: dict[str, Callable[[], Any]] = {"[]": list, "{}": dict}


@lru_cache(maxsize=256)
def claim_sql(
    *,
    queues: bool,
    exclude: bool,
    db: str | None = None,
    namespace: str = "",
    paused: bool = False,
    limited: bool = False,
    template: str = _CLAIM_SQL,
) -> str:
    """``_CLAIM_SQL`` with the filters in use (named parameters, see ``_claim_pg``),
    for database ``db`` (default: the job table's) and ``namespace`` (a literal:
    ``namespace_literal``). ``limited``: some queues have ``DISPATCH["QUEUES"]``
    limits, and the statement leases none of their rows (the limits gate,
    ``gates.limits.ConcurrencyGate``, admits them). Built once per set of
    arguments: every claim asks, and formatting the text was 1% of a worker's
    CPU in a drain of short jobs. ``template``: another statement holding
    ``_CLAIM_CTES`` (``store.wave``'s), rendered the same way."""
    connection = connections[db or db_alias()]
    filters = ""
    if queues:
        filters += " AND queue_name = ANY(%(queues)s)"
    if exclude:
        filters += " AND NOT (id = ANY(%(exclude)s))"
    if paused:
        filters += PAUSED_FILTER_SQL
    return job_sql(connection, template).format(
        fields=", ".join(CLAIM_FIELDS),
        filters=filters,
        namespace=namespace_literal(namespace),
        lease_filters=LIMITED_FILTER_SQL if limited else "",
    )


def claim_pg(
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
    with hot_cursor(connections[db]) as cursor:
        cursor.execute(sql, params)
        records = cursor.fetchall()
    return claimed_rows(records)


def claimed_rows(
    records: Sequence[Sequence[Any]], skip: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``CLAIMED_ROWS_SQL``'s records as (rows leased, rows only locked), each a
    dict of ``CLAIM_FIELDS`` and ``db_now``, its JSON decoded. ``skip``: columns
    ahead of them in each record (``store.wave``'s)."""
    leased: list[dict[str, Any]] = []
    locked: list[dict[str, Any]] = []
    for record in records:
        row = dict(zip(_CLAIM_COLUMNS, record[skip:] if skip else record, strict=True))
        for name in _JSON_FIELDS:
            text = row[name]
            if isinstance(text, str):
                empty = _EMPTY_JSON.get(text)
                row[name] = empty() if empty is not None else json.loads(text)
        (leased if row.pop("leased") else locked).append(row)
    return leased, locked
