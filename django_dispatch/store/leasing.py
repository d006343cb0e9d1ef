"""A claim's lease, written once: the SET list every claim path applies.

A lease makes a pending job running under this worker: a new epoch (which
fences every later write of the previous holder), an expiry on the database
clock, one more attempt, and the worker's id appended to the job's history.
The fused PostgreSQL claim (``sources.fused_pg``) writes it inside its own
statement, ``jobs_lease`` writes it for rows a claim locked and chose in
Python; both take their SET list from ``lease_set_sql``, and its ORM twin in
``jobs_lease`` is checked against the raw form by tests/store/test_raw_sql_twins.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce

from ..core.states import JobState
from ..models import Job
from .base import job_sql
from .sql import JSONAppend
from .types import ClaimedJob, Lease

#: The lease's SET list. ``{row}`` prefixes the job's own columns (a table
#: alias in an UPDATE ... FROM), ``{now}`` is the claim's database clock.
_LEASE_SET = """
    state = {running},
    worker_id = %(worker_id)s::text,
    lease_epoch = {row}lease_epoch + 1,
    lease_expires_at = {now} + %(lease_seconds)s * interval '1 second',
    heartbeat_at = {now},
    attempts = {row}attempts + 1,
    started_at = COALESCE({row}started_at, {now}),
    last_attempted_at = {now},
    worker_ids = COALESCE({row}worker_ids, '[]'::jsonb) || jsonb_build_array(%(worker_id)s::text)"""


def lease_set_sql(*, row: str, now: str) -> str:
    """``_LEASE_SET`` for a statement naming the job's columns ``{row}column``
    and the clock ``now``; other ``{names}`` are left for ``job_sql``."""
    return _LEASE_SET.replace("{row}", row).replace("{now}", now)


#: ``jobs_lease`` on PostgreSQL: the lease of rows this transaction has locked,
#: in raw SQL because the ORM's compilation of this UPDATE was a visible share
#: of a busy worker's claim (benchmark "mixed sizes"). ``now`` is the claim's
#: ``db_now``, as in the ORM update (SQLite's).
_LEASE_PG_SQL = (
    "UPDATE {job} SET"
    + lease_set_sql(row="", now="%(now)s::timestamptz")
    + "\nWHERE id = ANY(%(ids)s) AND state = {pending}\n"
)


def jobs_lease(
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


def claimed_job(
    row: dict[str, Any], worker_id: str, now: datetime, namespace: str = ""
) -> ClaimedJob:
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
