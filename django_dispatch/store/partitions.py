"""Partitioned FIFO: jobs sharing a partition key run one at a time, in order.

A keyed job is its partition's *head* when it is the oldest live (pending,
blocked or running) job of its key. Only a head may run, and only while no
job of its key is *active*: running, or cancelled but still held by a worker
that has not stopped it yet. A partial unique index (one running job per key)
enforces the first half in the database whatever the claim does.

To keep claims from rescanning deep backlogs, a claim that meets a pending
job that is not runnable *demotes* it to ``blocked``, which takes it out of
the claim index; finishing a partition's head *promotes* the next job back to
pending. The race between the two is closed by a lock: a claim demotes a job
only after locking (``FOR NO KEY UPDATE SKIP LOCKED``) the row that blocks
it, so a head being finished concurrently either makes the claim skip the
demotion, or makes the finisher wait until the demotion is committed and
then see it when it promotes. Enqueue takes no lock at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connections
from django.db.models import Q

from ..models import Job
from ..states import JobState
from .base import notify

#: One probe per key, each an index lookup: the head (oldest live job) and
#: an active job, if any. Plain SQL because the ORM cannot join a list of
#: values to correlated subqueries; written for PostgreSQL and SQLite alike.
_HEADS_SQL = """
SELECT k.column1,
    (SELECT j.id FROM django_dispatch_job j
      WHERE j.partition_key = k.column1 AND j.state IN ('pending', 'blocked', 'running')
      ORDER BY j.id LIMIT 1),
    (SELECT j.id FROM django_dispatch_job j
      WHERE j.partition_key = k.column1
        AND (j.state = 'running' OR (j.state = 'cancelled' AND j.lease_expires_at IS NOT NULL))
      LIMIT 1)
FROM (VALUES {values}) AS k
"""


@dataclass(frozen=True, slots=True)
class Head:
    head_id: int | None  # the oldest live job of the key
    active_id: int | None  # a job of the key that a worker is running

    def runnable(self, job_id: int) -> bool:
        return self.active_id is None and self.head_id == job_id

    def blocker(self) -> int | None:
        """The row whose change would unblock the key's other jobs."""
        return self.active_id if self.active_id is not None else self.head_id


def partition_heads(db: str, keys: Iterable[str]) -> dict[str, Head]:
    keys = sorted(set(keys))
    if not keys:
        return {}
    sql = _HEADS_SQL.format(values=", ".join(["(%s)"] * len(keys)))
    with connections[db].cursor() as cursor:
        cursor.execute(sql, keys)
        return {key: Head(head_id, active_id) for key, head_id, active_id in cursor.fetchall()}


def lock_blockers(db: str, blocker_ids: Iterable[int]) -> set[int]:
    """Lock the rows that block demoted jobs; return those locked.

    A row we cannot lock at once is being finished (or claimed) by someone
    else right now: the jobs it blocks stay pending, to be looked at again.
    """
    ids = sorted(set(blocker_ids))
    if not ids:
        return set()
    # A cancelled row blocks only while its worker still holds it; a plain
    # cancelled (or any finished) row must not be locked as a blocker, or a
    # demotion could race with its cancel or release and leave the next job
    # blocked with nothing ahead of it to promote it.
    still_blocking = Q(state__in=[JobState.PENDING, JobState.BLOCKED, JobState.RUNNING]) | Q(
        state=JobState.CANCELLED, lease_expires_at__isnull=False
    )
    return set(
        Job.objects.using(db)
        .filter(still_blocking, id__in=ids)
        .select_for_update(skip_locked=True, no_key=True)
        .values_list("id", flat=True)
    )


#: The one promotion: each listed key's oldest live job, if blocked, becomes
#: pending. ``{keys}`` is a table of keys in a column ``partition_key``. Plain
#: SQL because the ORM cannot join a list of values to a correlated subquery;
#: PostgreSQL and SQLite alike.
_PROMOTE_SQL = """
UPDATE django_dispatch_job SET state = 'pending'
WHERE state = 'blocked' AND id IN (
    SELECT (SELECT j.id FROM django_dispatch_job j
             WHERE j.partition_key = k.partition_key
               AND j.state IN ('pending', 'blocked', 'running')
             ORDER BY j.id LIMIT 1)
    FROM ({keys}) AS k
)
"""


def _promote(db: str, keys_sql: str, params: list[str]) -> int:
    with connections[db].cursor() as cursor:
        cursor.execute(_PROMOTE_SQL.format(keys=keys_sql), params)
        promoted = cursor.rowcount
    if promoted:
        notify(db)
    return promoted


def partition_promote(db: str, key: str) -> bool:
    """Make ``key``'s oldest live job pending if it is blocked.

    Called in the same transaction as every transition that may free the
    key: a head finishing, failing for good or being cancelled, and a
    cancelled job's worker letting go.
    """
    return partitions_promote(db, [key]) > 0


def partitions_promote(db: str, keys: Iterable[str]) -> int:
    """``partition_promote`` for every key in ``keys``; returns how many were promoted.

    Used by the batched completion of a wave of jobs: the same transaction,
    the same lock protocol (see the module docstring), one statement.
    """
    keys = sorted(set(keys))
    if not keys:
        return 0
    values = " UNION ALL ".join(["SELECT %s AS partition_key"] * len(keys))
    return _promote(db, values, keys)


def partitions_promote_stalled(db: str) -> int:
    """Promote every blocked job that is its partition's oldest live job.

    The safety net of the promote protocol, run by the leader now and then.
    The lock protocol closes the race between a claim's demotion and a head
    finishing, but not every pair of concurrent transitions: a head finishing
    while the job behind it is cancelled can leave the next one blocked, each
    transaction promoting from a snapshot that did not see the other's change.
    Such a key would otherwise wait forever. Promoting too much is harmless:
    the claim checks again that a job is runnable before it runs it.
    """
    keys = "SELECT DISTINCT partition_key FROM django_dispatch_job WHERE state = 'blocked'"
    return _promote(db, keys, [])
