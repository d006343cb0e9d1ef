"""An atomic job's fenced success and its commit, sent together: one round trip.

An atomic task's body runs in a transaction that its job's success must
commit (``runtime.atomic``). Written as any success is (``jobs_finish_many_if_leased``
for a wave of one, then Django's COMMIT), an atomic no-op costs three round
trips, each a wake-up of both the worker and the server: BEGIN (psycopg
sends it before the first statement), the fenced write, COMMIT. A wave of
plain jobs shares them among hundreds of jobs; an atomic job cannot.

``job_commit_success_if_leased`` sends the fenced UPDATE, the usage record
and the COMMIT as one simple-protocol query (``stmt; COMMIT``); when the body
wrote nothing the transaction is not open yet, and the statement runs alone,
its own implicit transaction. The statement is also cheaper to plan than the
wave's (no arrays to unnest, no JSON rows to join): this one runs once per
job, unprepared (Django's default), so its planning is paid every time.

The fence must stop the COMMIT that follows it in the same query, which the
client never gets to decide on: when the UPDATE matched no row, the final
SELECT fails (a cast that cannot succeed), the server skips the rest of the
query, and the transaction is left aborted for the caller to roll back. Only
the result decides the cast, so the planner cannot fold it into an error of
every call. The error is recognised by its SQLSTATE and ``LOST``.

PostgreSQL on psycopg 3 and unkeyed jobs only (``fast_path_available``): a
keyed job's success takes its partition's lock before the UPDATE and promotes
the next job after it, which the wave's path does; psycopg 2 and SQLite take
that path too. Through PgBouncer in transaction mode a simple query with a
COMMIT in it is an ordinary transaction; nothing is prepared.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import DataError, connections

from ..models import JobUsage
from .base import job_sql
from .types import Lease
from .usage import UsageEntry

#: What the fence's failed cast says, in the server's log and in the error.
LOST = "django_dispatch: lease lost, success rolled back"
#: invalid_text_representation: how a failed cast to integer reports itself.
_CAST_FAILED = "22P02"

_SUCCESS_SQL = """
WITH done AS (
    UPDATE {job} SET state = {succeeded}, return_value = %s::jsonb, finished_at = now(),
        lease_expires_at = NULL
    WHERE id = %s AND state = {running} AND worker_id = %s AND lease_epoch = %s
    RETURNING id
){usage}
SELECT (CASE WHEN count(*) = 1 THEN '1' ELSE '{lost}' END)::integer FROM done"""
#: The winner's usage record, from ``done`` so that a lost fence writes none.
_USAGE_SQL = """,
recorded AS (
    INSERT INTO {table} (namespace, job_id, task_path, queue_name, attempt, worker_id, host,
        outcome, started_at, wall_seconds, cpu_seconds, peak_rss_mb, resources)
    SELECT %s, done.id, %s, %s, %s, %s, %s, %s, %s::timestamptz, %s::float8, %s::float8,
        %s::float8, %s::jsonb
    FROM done
)"""
_RENDERED: dict[tuple[str, bool, bool], str] = {}


def fast_path_available(db: str, lease: Lease) -> bool:
    """Whether ``job_commit_success_if_leased`` can write this job's success."""
    if lease.partition_key:
        return False
    connection = connections[db]
    if connection.vendor != "postgresql":
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3


def job_commit_success_if_leased(
    lease: Lease, return_value: Any, usage: UsageEntry | None, *, db: str
) -> bool:
    """Inside an open ``atomic`` block on ``db``: running -> succeeded, fenced, and COMMIT.

    True: the success, ``usage`` and whatever the transaction wrote before are
    committed (Django's own commit at the end of the block then has nothing
    left to do). False: the fence matched no row (cancelled, timed out or
    reclaimed meanwhile), nothing is committed, and the transaction is left
    for the caller to roll back. Any other error is raised, nothing committed.
    Call it last in the transaction: it commits.
    """
    from psycopg.pq import TransactionStatus

    connection = connections[db]
    connection.ensure_connection()  # the job thread checked it before the body
    raw = connection.connection
    # The body wrote nothing: psycopg has not sent BEGIN yet.
    idle = raw.info.transaction_status == TransactionStatus.IDLE
    params: list[Any] = [
        None if return_value is None else json.dumps(return_value),
        lease.job_id,
        lease.worker_id,
        lease.epoch,
    ]
    if usage is not None:
        params += _usage_params(usage)
    sql = _sql(connection, usage is not None, commit=not idle)
    try:
        if idle:
            # One statement is its own transaction: psycopg's BEGIN is not
            # needed, and would cost a round trip of its own.
            raw.autocommit = True
        with connection.wrap_database_errors, _client_cursor(connection) as cursor:
            cursor.execute(sql, params)
    except DataError as e:
        if getattr(e.__cause__, "sqlstate", None) == _CAST_FAILED and LOST in str(e):
            return False
        raise
    finally:
        # Back as Django left it. A connection the statement broke is not
        # IDLE, refuses the switch, and is closed by the block's end anyway.
        if idle and raw.info.transaction_status == TransactionStatus.IDLE:
            raw.autocommit = False
    return True


def _client_cursor(connection: Any) -> Any:
    """A psycopg client-binding cursor: the simple query protocol, which runs
    ``stmt; COMMIT`` in one message (the extended protocol takes one statement).
    Django's own cursor is one too, unless the site turned server-side binding on."""
    from django.db.backends.postgresql.base import Cursor

    # django-stubs declare the class without psycopg's arguments.
    return connection._prepare_cursor(Cursor(connection.connection))  # type: ignore[call-arg]


def _sql(connection: Any, with_usage: bool, *, commit: bool) -> str:
    key = (connection.alias, with_usage, commit)
    sql = _RENDERED.get(key)
    if sql is None:
        usage = ""
        if with_usage:
            table = connection.ops.quote_name(JobUsage._meta.db_table)
            usage = _USAGE_SQL.format(table=table)
        template = _SUCCESS_SQL.replace("{usage}", usage).replace("{lost}", LOST)
        sql = job_sql(connection, template) + (";\nCOMMIT" if commit else "")
        _RENDERED[key] = sql
    return sql


def _usage_params(e: UsageEntry) -> list[Any]:
    return [
        e.namespace,
        e.task_path,
        e.queue_name,
        e.attempt,
        e.worker_id,
        e.host,
        e.outcome,
        e.started_at,
        e.wall_seconds,
        e.cpu_seconds,
        e.peak_rss_mb,
        None if e.resources is None else json.dumps(e.resources),
    ]
