"""Usage records: one row per attempt, written with the attempt's outcome.

The worker measures (``runtime.metering``); the store writes, always inside
the transaction that records the outcome, so a job's history and its usage
agree: a success's record is part of its completion wave (on PostgreSQL in
the very statement that finishes the wave, see ``jobs_finish_many_if_leased``;
elsewhere one multi-row INSERT per wave, beside its UPDATE), a failure's or a timeout's is
written with its fenced write, and a lost worker's by the reclaim that
notices it. Only attempts whose fenced write *won* get a record: a write that
lost (the job was reclaimed meanwhile) belongs to an attempt somebody else
has recorded already.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models.functions import Now

from ..models import JobUsage
from .base import db_alias, delete_in_batches


@dataclass(frozen=True, slots=True)
class UsageEntry:
    """One attempt's record, as the worker knows it when the outcome is written."""

    job_id: int
    namespace: str
    task_path: str
    queue_name: str
    attempt: int
    worker_id: str
    host: str
    outcome: str
    started_at: datetime
    wall_seconds: float | None
    cpu_seconds: float | None
    peak_rss_mb: float | None
    resources: dict[str, int] | None

    def model(self) -> JobUsage:
        return JobUsage(
            job_id=self.job_id,
            namespace=self.namespace,
            task_path=self.task_path,
            queue_name=self.queue_name,
            attempt=self.attempt,
            worker_id=self.worker_id,
            host=self.host,
            outcome=self.outcome,
            started_at=self.started_at,
            wall_seconds=self.wall_seconds,
            cpu_seconds=self.cpu_seconds,
            peak_rss_mb=self.peak_rss_mb,
            resources=self.resources,
        )


#: ``usage_record_many`` on PostgreSQL: the whole wave as one JSON array of
#: rows, unpacked by the server. The hot path builds one list per row and
#: one ``json.dumps`` (C) instead of a model instance and 13 prepared fields
#: per row (``bulk_create``'s cost would be a tenth of a busy worker's
#: drain), and instead of 13 typed arrays, whose element-by-element
#: adaptation in psycopg was still a fifth of a busy worker's CPU (profiled).
#: ``started_at`` travels as ISO 8601 (exact to the microsecond), floats as
#: ``repr`` (exact); a JSON null stays SQL NULL. Its twin is the
#: ``bulk_create`` below (tests/runtime/test_usage.py). ``{rows}``: where the JSON
#: rows ``r`` come from (``usage_insert_sql``).
_INSERT_ROWS_SQL = """
INSERT INTO {table} (namespace, job_id, task_path, queue_name, attempt, worker_id, host,
    outcome, started_at, wall_seconds, cpu_seconds, peak_rss_mb, resources)
SELECT r->>0, (r->>1)::bigint, r->>2, r->>3, (r->>4)::integer, r->>5, r->>6, r->>7,
    (r->>8)::timestamptz, (r->>9)::float8, (r->>10)::float8, (r->>11)::float8,
    NULLIF(r->12, 'null'::jsonb)
FROM {rows}
"""
#: The JSON array's rows, all of them (``usage_record_many``).
_ALL_ROWS = "jsonb_array_elements(%s::jsonb) AS r"
#: Where a row's job id is, for a statement that joins the rows to its jobs.
USAGE_ROW_JOB_ID = "(r->>1)::bigint"
_RENDERED: dict[tuple[str, str], str] = {}


def usage_insert_sql(connection: Any, rows: str = _ALL_ROWS) -> str:
    """The PostgreSQL INSERT of JSON usage rows ``r`` taken from ``rows`` (a FROM clause).

    One text for both of its users: ``usage_record_many`` inserts every row of
    the array, the fenced finish of a wave (``store.finish``) only the rows
    whose job it won, joining on ``USAGE_ROW_JOB_ID``. Each takes the array
    as one parameter built by ``usage_rows_json``. Rendered once per
    ``rows`` and table name.
    """
    table = connection.ops.quote_name(JobUsage._meta.db_table)
    sql = _RENDERED.get((rows, table))
    if sql is None:
        sql = _RENDERED[(rows, table)] = _INSERT_ROWS_SQL.format(table=table, rows=rows)
    return sql


def usage_rows_json(entries: Iterable[UsageEntry]) -> str:
    """``entries`` as the JSON array ``usage_insert_sql`` unpacks (one ``json.dumps``)."""
    return json.dumps(
        [
            [
                e.namespace,
                e.job_id,
                e.task_path,
                e.queue_name,
                e.attempt,
                e.worker_id,
                e.host,
                e.outcome,
                e.started_at.isoformat() if e.started_at else None,
                e.wall_seconds,
                e.cpu_seconds,
                e.peak_rss_mb,
                e.resources,
            ]
            for e in entries
        ]
    )


def usage_record_many(
    entries: Sequence[UsageEntry], *, db: str | None = None, raw: bool | None = None
) -> None:
    """Insert the records of one wave (call inside the wave's transaction).

    One INSERT for the wave; ``finished_at`` takes the database's ``now()``
    (its ``db_default``), the same clock as the job's ``finished_at``.
    ``raw``: force (True) or avoid (False) the PostgreSQL statement (tests).
    A wave of successes on PostgreSQL does not come here: its records go in
    the statement that finishes it (``jobs_finish_many_if_leased``).
    """
    if not entries:
        return
    db = db or db_alias()
    connection = connections[db]
    if raw is None:
        raw = connection.vendor == "postgresql"
    if not raw:
        JobUsage.objects.using(db).bulk_create([e.model() for e in entries])
        return
    with connection.cursor() as cursor:
        cursor.execute(usage_insert_sql(connection), [usage_rows_json(entries)])


def usage_record_lost(db: str, rows: Iterable[Mapping[str, Any]], namespace: str) -> None:
    """The reclaim's record of attempts lost with their worker: what the row knew.

    ``rows`` are the expired running jobs being rescued (``id``, ``task_path``,
    ``queue_name``, ``attempts``, ``worker_id``, ``last_attempted_at``,
    ``resources``). Nobody saw the attempt end, so wall, CPU and RSS are
    unknown (None); ``started_at`` is when it was leased, ``finished_at``
    when the loss was noticed.
    """
    entries = [
        UsageEntry(
            job_id=row["id"],
            namespace=namespace,
            task_path=row["task_path"],
            queue_name=row["queue_name"],
            attempt=row["attempts"],
            worker_id=row["worker_id"] or "",
            # A worker id is "host:pid:nonce" (runtime.options.default_worker_id).
            host=(row["worker_id"] or "").split(":", 1)[0],
            outcome="worker_lost",
            started_at=row["last_attempted_at"],
            wall_seconds=None,
            cpu_seconds=None,
            peak_rss_mb=None,
            resources=row.get("resources"),
        )
        for row in rows
        if row["last_attempted_at"] is not None
    ]
    usage_record_many(entries, db=db)


def usage_purge(
    *, older_than: float, batch: int, max_seconds: float, db: str | None = None, namespace: str = ""
) -> int:
    """Delete records older than ``older_than`` seconds, in bounded batches; how many.

    Each batch is one short DELETE of at most ``batch`` rows picked through
    ``dispatch_usage_finished``; batches repeat until caught up or
    ``max_seconds`` pass, like the jobs' retention purge.
    """
    db = db or db_alias()
    old = JobUsage.objects.using(db).filter(
        namespace=namespace, finished_at__lt=Now() - timedelta(seconds=older_than)
    )
    return delete_in_batches(old, "finished_at", batch=batch, max_seconds=max_seconds)


def usage_newest(
    *,
    task_path: str | None,
    namespace: str,
    since: datetime | None = None,
    limit: int = 100,
    db: str | None = None,
) -> list[JobUsage]:
    """The newest ``limit`` records of ``namespace`` (of one task, if given), newest first."""
    records = JobUsage.objects.using(db or db_alias()).filter(namespace=namespace)
    if task_path is not None:
        records = records.filter(task_path=task_path)
    if since is not None:
        records = records.filter(finished_at__gte=since)
    return list(records.order_by("-finished_at", "-id")[: max(0, limit)])
