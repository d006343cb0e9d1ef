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
from functools import lru_cache, partial
from operator import itemgetter
from typing import Any

from django.db import connections, transaction

from ..base import db_alias, hot_cursor, job_sql, namespace_literal
from ..flow import PAUSED_FILTER_SQL
from ..gates.limits import LIMITED_FILTER_SQL
from ..leasing import lease_set_sql
from ..types import CLAIM_FIELDS, ClaimedJob, Lease
from ..workflows import preclaim

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
#: ``_CLAIM_SQL`` that also claims the steps of the step jobs it leases
#: (``workflows.preclaim``): each record leads with ``preclaim.COLUMNS`` more.
_CLAIM_STEPS_SQL = (
    "WITH"
    + _CLAIM_CTES
    + preclaim.steps_cte(preclaim.CLAIM_LEASED)
    + CLAIMED_ROWS_SQL.replace("SELECT candidates.*", "SELECT s.*, candidates.*")
    + " LEFT JOIN steps AS s ON s.o_job = candidates.id"
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
#: Where the JSON columns sit in a record, and the names of a claimed row's
#: keys: the record's columns less ``leased``, its last.
_JSON_AT = tuple(_CLAIM_COLUMNS.index(name) for name in _JSON_FIELDS)
_ROW_COLUMNS = _CLAIM_COLUMNS[:-1]
#: A leased row's keys (``leasing.claimed_job``'s): ``CLAIM_FIELDS`` and the
#: lease's ``last_attempted_at``, which takes ``db_now``'s place.
_LEASED_COLUMNS = (*CLAIM_FIELDS, "last_attempted_at")


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
    """Run ``_CLAIM_SQL``: (rows it leased, rows it only locked).

    While this process leases step jobs (``preclaim.STEP_JOBS``), the same
    statement claims their steps, kept for the jobs' attempts once the
    caller's transaction commits (never if it rolls back)."""
    steps = lease > 0 and preclaim.STEP_JOBS.expected()
    sql = claim_sql(
        queues=bool(queues),
        exclude=bool(exclude),
        db=db,
        namespace=namespace,
        paused=bool(paused),
        limited=bool(limited),
        template=_CLAIM_STEPS_SQL if steps else _CLAIM_SQL,
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
        "step_task": preclaim.STEP_TASK,
    }
    with hot_cursor(connections[db]) as cursor:
        cursor.execute(sql, params)
        records = cursor.fetchall()
    leased, locked = claimed_rows(records, preclaim.COLUMNS if steps else 0)
    if steps:
        epochs = {row["id"]: row["lease_epoch"] + 1 for row in leased}  # as their leases
        transaction.on_commit(partial(preclaim.keep, db, records, 0, epochs), using=db)
    if lease > 0:
        preclaim.STEP_JOBS.saw(leased)
    return leased, locked


def claimed_rows(
    records: Sequence[Sequence[Any]], skip: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``CLAIMED_ROWS_SQL``'s records as (rows leased, rows only locked), each a
    dict of ``CLAIM_FIELDS`` and ``db_now``, its JSON decoded. ``skip``: columns
    ahead of them in each record (``store.wave``'s).

    The JSON columns are decoded by position in a list of the record's values,
    and the dict is built once from it: per claimed job, on the worker's
    control loop, looking each column up by name was most of this function."""
    leased: list[dict[str, Any]] = []
    locked: list[dict[str, Any]] = []
    for record in records:
        values, was_leased = _decoded(record, skip)
        (leased if was_leased else locked).append(dict(zip(_ROW_COLUMNS, values, strict=True)))
    return leased, locked


def _decoded(record: Sequence[Any], skip: int) -> tuple[list[Any], Any]:
    """A record's values past ``skip``, its JSON columns decoded by position,
    and its last column, ``leased`` (taken off the values)."""
    values = list(record[skip:]) if skip else list(record)
    for at in _JSON_AT:
        text = values[at]
        if type(text) is str:
            empty = _EMPTY_JSON.get(text)
            values[at] = empty() if empty is not None else json.loads(text)
    return values, values.pop()


def claimed_records(
    records: Sequence[Sequence[Any]], skip: int, worker_id: str, namespace: str
) -> tuple[list[ClaimedJob], list[dict[str, Any]]]:
    """``claimed_rows`` and ``leasing.claimed_job`` of each row leased, in one
    pass: (the jobs leased, as they stand after their lease; the rows only
    locked). The same values, keys and order as those two (tests/store/test_wave.py
    compares them).

    Per claimed job, on the worker's control loop, so each row's dict is built
    straight from the record (``zip`` stops before ``leased``, the last column)
    and the lease applied to it by name; a leased row whose JSON columns are
    the usual empty ones (``_USUAL_JSON``) takes fresh empty values without a
    look at each column. The records' width is checked once per claim: every
    record of one statement has the same."""
    if records and len(records[0]) != skip + len(_CLAIM_COLUMNS):
        raise ValueError(
            f"the claim's records have {len(records[0]) - skip} columns, not {len(_CLAIM_COLUMNS)}"
        )
    jobs: list[ClaimedJob] = []
    locked: list[dict[str, Any]] = []
    for record in records:
        values = record[skip:] if skip else record
        if not record[-1]:  # only locked: the gates decide
            row = dict(zip(_ROW_COLUMNS, values))  # noqa: B905 (width checked above)
            _decode_json(row)
            locked.append(row)
            continue
        row = dict(zip(_LEASED_COLUMNS, values))  # noqa: B905 (width checked above)
        if _json_texts(row) == _USUAL_JSON:
            row["args"], row["kwargs"], row["errors"] = [], {}, []
            row["worker_ids"] = [worker_id]
        else:
            _decode_json(row)
            row["worker_ids"] = [*row["worker_ids"], worker_id]
        now = row["last_attempted_at"]  # the claim's db_now
        row["attempts"] += 1
        epoch = row["lease_epoch"] = row["lease_epoch"] + 1
        if row["started_at"] is None:
            row["started_at"] = now
        lease = Lease(row["id"], worker_id, epoch, row["partition_key"], namespace)
        jobs.append(ClaimedJob(lease, row, now))
    return jobs, locked


#: The JSON columns' texts (``_JSON_FIELDS``' order) of most claimed rows: no
#: arguments, checkpoint, errors, earlier workers, trace, call context or
#: resources. One C call reads a row's eight and one comparison checks them.
_USUAL_JSON = ("[]", "{}", None, "[]", "[]", None, None, None)
_json_texts = itemgetter(*_JSON_FIELDS)


def _decode_json(row: dict[str, Any]) -> None:
    """Decode ``row``'s JSON columns in place (``_decoded``'s, by name)."""
    for name in _JSON_FIELDS:
        text = row[name]
        if type(text) is str:
            empty = _EMPTY_JSON.get(text)
            row[name] = empty() if empty is not None else json.loads(text)
