"""The finish of a whole wave of successes: one fenced statement, one commit.

A busy worker returns results faster than one UPDATE and one commit each
can record them, so it finishes them in waves. Every row of a wave is still
fenced by its own lease (id, ``state = 'running'``, worker_id, lease_epoch):
a job cancelled, timed out or reclaimed meanwhile matches nothing, stays as
it is and is not among the winners, and its attempt's usage is recorded by
whoever took the job over.

On PostgreSQL the wave is raw SQL (``_FINISH_MANY_SQL``, with the usage
records ``_FINISH_MANY_USAGE_SQL``); elsewhere its ORM twin
``_finish_many_orm``. tests/store/test_raw_sql_twins.py and tests/store/test_usage_wave.py
run both on the same rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.db.models import Case, JSONField, Q, Value, When
from django.db.models.functions import Cast, Now

from ..core.states import JobState
from ..models import Job, JobUsage
from .base import db_alias, hot_cursor, job_sql
from .partitions import lock_partitions, partitions_promote, try_lock_partitions
from .sql import bool_array, float_array, int_array, text_array
from .types import Lease
from .usage import UsageEntry, usage_record_many

logger = logging.getLogger("django_dispatch.store")


class Measured(NamedTuple):
    """What a success's usage record takes from the worker on PostgreSQL: the
    rest (task, queue, attempt, worker, start, resources) is the winner's own
    row (``_FINISH_MANY_USAGE_SQL``). A tuple of five, built per job of a
    wave: a ``UsageEntry`` of 13 fields per job is a visible share of a no-op
    job's CPU. A ``UsageEntry`` serves as well."""

    wall_seconds: float | None
    cpu_seconds: float | None
    peak_rss_mb: float | None
    host: str
    outcome: str


#: A wave's usage records by job id, as the PostgreSQL statements take them.
MeasuredUsage = Mapping[int, "UsageEntry | Measured"]


#: ``jobs_finish_many_if_leased`` for PostgreSQL: the fenced UPDATE of a
#: whole wave with the values as four arrays, returning the winners, so one
#: statement (and no ORM compilation of a CASE per row) records the wave.
#: Its twin is ``_finish_many_orm`` (tests/store/test_raw_sql_twins.py).
#:
#: The fence's state test is written ``(state = 'running') IS TRUE`` (the same
#: for a NOT NULL column) so that the planner cannot answer it from the
#: partial index ``dispatch_job_lease`` (``WHERE state = 'running'``): on it,
#: the planner estimates "a few running rows" and scans that whole index (a
#: bitmap scan, which never marks dead entries, so it reads every job
#: finished since the last vacuum) instead of looking each id up in the
#: primary key. docs/performance.md has the plans and the timings.
#:
#: ``{more}`` and ``{returning}``: the measured values and the row's own
#: columns of the winners' usage records (``_FINISH_MANY_USAGE_SQL``), or nothing.
#:
#: ``l`` locks the rows the fence holds first, in id order (its ``FOR
#: UPDATE`` sits above the sort), and only those: a row another worker
#: leased since is not locked here, as the UPDATE would not lock it, so a
#: fenced-out finish never makes a lease's holder wait. An UPDATE alone
#: locks in the order its plan reads the rows (the heap's, or the array's),
#: while the heartbeat's renewal and the one-statement wave lock a worker's
#: running rows in id order (``store.leases``, migration 0030): two
#: statements locking the same rows in different orders can deadlock.
_FINISH_MANY_SQL = """
UPDATE {job} AS j SET
    state = {succeeded}, return_value = d.return_value, finished_at = now(),
    lease_expires_at = NULL
FROM (
    SELECT id FROM {job} WHERE (state = {running}) IS TRUE
        AND (id, worker_id, lease_epoch) IN (
            SELECT * FROM unnest(%(ids)s::bigint[], %(workers)s::text[], %(epochs)s::bigint[]))
    ORDER BY id FOR UPDATE
) AS l,
unnest(%(ids)s::bigint[], %(workers)s::text[], %(epochs)s::bigint[], %(values)s::jsonb[]{more})
    AS d(id, worker_id, lease_epoch, return_value{more_names})
WHERE j.id = l.id AND j.id = d.id AND (j.state = {running}) IS TRUE AND j.worker_id = d.worker_id
    AND j.lease_epoch = d.lease_epoch
RETURNING j.id, j.partition_key{returning}
"""


def jobs_finish_many_if_leased(
    results: Sequence[tuple[Lease, Any]],
    *,
    db: str | None = None,
    usage: Mapping[int, UsageEntry] | None = None,
) -> set[int]:
    """running -> succeeded for many jobs at once; return the ids that won.

    The hot path of a busy worker: one UPDATE and one commit for a whole wave
    of finished jobs instead of one each. Each row is still fenced by its own
    (id, worker_id, lease_epoch); jobs lost meanwhile are left alone and not
    in the result. The partitions the winners free get their next jobs
    promoted in the same transaction, as ``job_finish_if_leased`` does, under
    their keys' locks: taken before the UPDATE, in one statement, from the
    keys the leases carry, so a wave of unkeyed jobs takes none.

    ``usage``: the attempts' usage records by job id. Only the winners'
    are written (a loser's attempt is recorded by whoever took its job over),
    in this transaction: on PostgreSQL by the finishing statement itself
    (``_FINISH_MANY_USAGE_SQL``), elsewhere by one INSERT after it.
    """
    if not results:
        return set()
    db = db or db_alias()
    keys = {lease.partition_key for lease, _ in results if lease.partition_key}
    with transaction.atomic(using=db, savepoint=False):
        lock_partitions(db, keys)
        if connections[db].vendor == "postgresql":
            winners = _finish_many_pg(results, db, usage)
        else:
            winners = _finish_many_orm(results, db)
            if usage:
                usage_record_many([usage[i] for i in winners if i in usage], db=db)
        freed = {key for key in winners.values() if key}
        if freed - keys:
            freed = keys & freed | _lock_late(db, freed - keys)
        # A worker serves one namespace, so a wave has one; grouped anyway,
        # since the leases say so and a key is a key within its namespace.
        namespace_of = {lease.job_id: lease.namespace for lease, _ in results}
        by_namespace: dict[str, set[str]] = {}
        for job_id, key in winners.items():
            if key in freed:
                by_namespace.setdefault(namespace_of[job_id], set()).add(key)
        for namespace, namespace_keys in by_namespace.items():
            partitions_promote(db, namespace_keys, namespace)
    return set(winners)


def _lock_late(db: str, keys: set[str]) -> set[str]:
    """The keys of winners whose lease did not carry them: lock what we can now.

    Their rows are locked already, so waiting for a key's lock here could
    deadlock; only free keys are taken (and promoted). A busy one is left to
    the leader's sweep. Only leases built by hand without their key get here.
    """
    locked = try_lock_partitions(db, keys)
    logger.warning(
        "finished jobs of partitions %s with leases that did not carry their partition key; %s",
        sorted(keys),
        "promoted" if locked == keys else f"left {sorted(keys - locked)} to the leader's sweep",
    )
    return locked


#: ``_FINISH_MANY_SQL`` writing the winners' usage records too, in the same
#: statement: the wave's UPDATE is a data-modifying CTE (``done``, its
#: RETURNING rows: exactly the winners) and each winner's record is made from
#: its own row, so a job whose fence failed gets no record. One round trip per
#: wave instead of two, on the path every success takes. A record takes from
#: the row what the row knows as the worker does (namespace, task, queue,
#: attempt, worker, when the attempt was leased: ``last_attempted_at``, the
#: claim's clock that ``ClaimedJob.claimed_at`` holds too, its resources), and
#: from the worker only what it measured, as three more arrays beside the
#: finish's own (``metered``: the job has a record to write), plus the host
#: and the outcome, the same for the whole wave of one worker: parsing and
#: planning 13 JSON fields per record would be a visible share of the
#: statement's server time. Its twin is ``_finish_many_orm`` followed by
#: ``usage_record_many`` of the winners (tests/store/test_usage_wave.py).
_FINISH_MANY_USAGE_SQL = """
WITH done AS ({finish}),
recorded AS ({insert})
SELECT id, partition_key FROM done
"""
_FINISH_MANY_USAGE_RENDERED: dict[str, str] = {}
#: ``_FINISH_MANY_SQL``'s fill-ins: none (no usage records), or the measured
#: values in and the winners' record columns out (``FINISHED_USAGE_SQL``).
_PLAIN_FILL = {"more": "", "more_names": "", "returning": ""}
_METERED_FILL = {
    "more": ", %(metered)s::boolean[], %(walls)s::float8[], %(cpus)s::float8[], %(rss)s::float8[]",
    "more_names": ", metered, wall, cpu, rss",
    "returning": (
        ", j.namespace, j.task_path, j.queue_name, j.attempts, j.worker_id,"
        " j.last_attempted_at, j.resources, d.metered, d.wall, d.cpu, d.rss"
    ),
}
#: The INSERT of the records of ``done``'s metered winners.
FINISHED_USAGE_SQL = """
INSERT INTO {usage} (namespace, job_id, task_path, queue_name, attempt, worker_id, host,
    outcome, started_at, wall_seconds, cpu_seconds, peak_rss_mb, resources)
SELECT namespace, id, task_path, queue_name, attempts, worker_id, %(host)s::text,
    %(outcome)s::text, last_attempted_at, wall, cpu, rss, resources
FROM done WHERE metered
"""


def _filled(template: str, fill: Mapping[str, str]) -> str:
    for name, text in fill.items():
        template = template.replace("{" + name + "}", text)
    return template


_FINISH_SQL = {
    False: _filled(_FINISH_MANY_SQL, _PLAIN_FILL),
    True: _filled(_FINISH_MANY_SQL, _METERED_FILL),
}


def finish_sql(connection: Any, usage: bool) -> str:
    """``_FINISH_MANY_SQL`` for ``connection``, with the usage records' columns or not."""
    return job_sql(connection, _FINISH_SQL[usage])


def finished_usage_sql(connection: Any) -> str:
    """``FINISHED_USAGE_SQL`` for ``connection``'s usage table."""
    return FINISHED_USAGE_SQL.replace("{usage}", connection.ops.quote_name(JobUsage._meta.db_table))


def _finish_many_usage_sql(connection: Any) -> str:
    """``_FINISH_MANY_USAGE_SQL`` for ``connection``, rendered once per database."""
    sql = _FINISH_MANY_USAGE_RENDERED.get(connection.alias)
    if sql is None:
        sql = _FINISH_MANY_USAGE_RENDERED[connection.alias] = _FINISH_MANY_USAGE_SQL.format(
            finish=finish_sql(connection, True).strip(),
            insert=finished_usage_sql(connection).strip(),
        )
    return sql


def _finish_many_pg(
    results: Sequence[tuple[Lease, Any]],
    db: str,
    usage: Mapping[int, UsageEntry] | None = None,
) -> dict[int, str | None]:
    """``_FINISH_MANY_SQL`` (PostgreSQL): {winner id: partition key}.

    With ``usage``, ``_FINISH_MANY_USAGE_SQL``: the winners' records in the
    same statement.
    """
    connection = connections[db]
    params = finish_params(results, usage)
    sql = _finish_many_usage_sql(connection) if usage else finish_sql(connection, False)
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        return dict(cursor.fetchall())


def finish_params(
    results: Sequence[tuple[Lease, Any]], usage: MeasuredUsage | None
) -> dict[str, Any]:
    """The named parameters of ``_FINISH_MANY_SQL`` (and of the usage records, with
    ``usage``: the winners' among ``results`` that have an entry are written).
    Each array is one text literal (``store.sql``: cheaper than psycopg's lists)."""
    ids = [lease.job_id for lease, _ in results]
    params: dict[str, Any] = {
        "ids": int_array(ids),
        "workers": text_array([lease.worker_id for lease, _ in results]),
        "epochs": int_array([lease.epoch for lease, _ in results]),
        # None as SQL NULL, as job_finish_if_leased stores it
        "values": text_array(
            [None if value is None else json.dumps(value) for _, value in results]
        ),
    }
    if usage:
        entries = [usage.get(job_id) for job_id in ids]
        # A wave's records share the worker's host and the outcome. With no
        # entry for any of ``results``, every ``metered`` is false: no record.
        first = next((e for e in entries if e is not None), Measured(None, None, None, "", ""))
        params.update(
            metered=bool_array([e is not None for e in entries]),
            walls=float_array([None if e is None else e.wall_seconds for e in entries]),
            cpus=float_array([None if e is None else e.cpu_seconds for e in entries]),
            rss=float_array([None if e is None else e.peak_rss_mb for e in entries]),
            host=first.host,
            outcome=first.outcome,
        )
    return params


def _finish_many_orm(results: Sequence[tuple[Lease, Any]], db: str) -> dict[int, str | None]:
    """``_finish_many_pg`` in the ORM (SQLite): {winner id: partition key}."""
    fence = Q()
    for lease, _ in results:
        fence |= Q(id=lease.job_id, worker_id=lease.worker_id, lease_epoch=lease.epoch)
    mine = Job.objects.using(db).filter(fence)
    # Cast: when every value is None, each branch is an untyped NULL, which
    # a JSON column would refuse.
    return_values = Cast(
        Case(
            *[
                When(id=lease.job_id, then=Value(value, output_field=JSONField()))
                for lease, value in results
            ],
            output_field=JSONField(),
        ),
        output_field=JSONField(),
    )
    mine.filter(state=JobState.RUNNING).update(
        state=JobState.SUCCEEDED,
        return_value=return_values,
        finished_at=Now(),
        lease_expires_at=None,
    )
    # Only this lease can have made its job succeed, so these are the winners.
    winners = dict(mine.filter(state=JobState.SUCCEEDED).values_list("id", "partition_key"))
    return winners
