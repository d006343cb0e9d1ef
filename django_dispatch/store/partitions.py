"""Partitioned FIFO: jobs sharing a partition key run one at a time, in order.

A keyed job is its partition's *head* when it is the oldest live (pending,
scheduled, blocked or running) job of its key. A deferred job keeps its
place: while it is scheduled, the jobs behind it wait (are demoted) as they
would behind a running head; once due, the stager makes it pending and the
claim runs it first. Only a head may run, and only while no
job of its key is *active*: running, or cancelled but still held by a worker
that has not stopped it yet. A partial unique index (one running job per key)
enforces the first half in the database whatever the claim does.

To keep claims from rescanning deep backlogs, a claim that meets a pending
job that is not runnable *demotes* it to ``blocked``, which takes it out of
the claim index; the transitions that free a key *promote* its head back to
pending. The guarantee: **no key is ever left with a blocked head and no
active job** (a *stalled* key, which nothing would ever promote).

How it holds: every transaction that demotes or promotes a key's jobs, or
takes a job of the key out of ``running`` or out of the live states, first
takes the key's lock, ``pg_advisory_xact_lock`` on the key's hash
(``lock_partitions``), before any row lock and, for several keys, in one
statement in hash order. Those transactions are therefore serialised per
key, and each reads the key (the head to promote, the jobs ahead of one to
demote) in a statement that starts after its lock was granted, so after the
previous holder committed: it sees every earlier transition of the key, and
the one after it sees its own. Without the lock, two of them (a head
finishing while the job behind it is cancelled, two cancels, a final failure
or a reclaim racing a cancel) each promoted from a snapshot that missed the
other's change, and the key stalled.

- The ending transitions take the lock and wait for it: finishing (one job
  or a batch: one lock statement per batch), failing (for good, or for a
  retry), cancelling, letting go of a cancelled job, handing a job back, and
  the reclaim of expired leases. A job going back to ``pending`` must promote
  too: ids are handed out before commit, so an older job of the key can
  appear (and be demoted) while a newer one runs; when the newer one returns
  to the queue, the older one is the head again.
- The claim never waits: it *tries* the lock of each key it wants to demote
  in (``try_lock_partitions``) and leaves that key's jobs pending if the key
  is busy; the demotion itself checks again, after the lock, that something
  runs or waits ahead of the job (``partitions_demote``).
- Transitions that cannot stall a key take no lock: an enqueue inserts a
  pending job, a claim's lease makes a pending job running (the key is then
  active), a heartbeat, progress and ``retry_now`` change no state, the
  purge deletes only finished rows. So unkeyed jobs, and the claim and
  heartbeat of keyed ones, pay nothing.

The lock is transaction-level, so it is released by the commit or rollback
itself and works through PgBouncer in transaction mode; a session-level
advisory lock would not. It uses the two-key form with a constant first key
(``LOCK_CLASS``), a space apart from the one-key form most code uses; two
keys whose hashes collide merely share a lock. On SQLite, which has one
writer at a time, every such transaction begins by writing (or by
``take_sqlite_write_lock``), so they are serialised already and the lock
functions do nothing. ``partitions_promote_stalled``, run by the leader,
stays as a safety net that should never find anything.

A key is a key *within a namespace*: heads, demotions and promotions only
look at jobs of the namespace in question, so the same key in two namespaces
is two independent partitions. The locks hash the key alone: the same key in
two namespaces shares a lock, which (like a hash collision) only serialises
more than needed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connections

from ..core.states import JobState
from .base import job_sql, notify_channel

#: The first key of every partition lock (``pg_advisory_xact_lock(int, int)``),
#: the second being ``hashtext(partition_key)``. Arbitrary; it only keeps our
#: locks apart from other users of the two-key form.
LOCK_CLASS = 0x44535054  # "DSPT"

#: Lock several keys, waiting, in one statement: in hash order, so that two
#: transactions locking overlapping sets of keys cannot deadlock.
_LOCK_SQL = """
SELECT pg_advisory_xact_lock(%s, h.h) FROM (
    SELECT DISTINCT hashtext(k) AS h FROM unnest(%s::text[]) AS k ORDER BY 1
) AS h
"""

#: Try to lock keys without waiting; returns the keys locked.
_TRY_LOCK_SQL = """
SELECT k FROM unnest(%s::text[]) AS k WHERE pg_try_advisory_xact_lock(%s, hashtext(k))
"""

#: Lock a job's key, if it has one, before its row is locked: one statement.
_LOCK_JOB_SQL = """
SELECT pg_advisory_xact_lock(%s, hashtext(partition_key)) FROM {job}
WHERE id = %s AND partition_key IS NOT NULL
"""


def lock_partitions(db: str, keys: Iterable[str | None]) -> None:
    """Take the locks of ``keys`` (None ignored) for the rest of the transaction.

    Waits for transactions holding any of them. Call it inside a transaction,
    before locking or changing any job row of those keys: rows first, key
    second could deadlock against a transaction doing it the right way.
    """
    wanted = sorted({key for key in keys if key})
    if wanted and connections[db].vendor == "postgresql":
        with connections[db].cursor() as cursor:
            cursor.execute(_LOCK_SQL, [LOCK_CLASS, wanted])


def lock_partition_of_job(db: str, job_id: int) -> None:
    """``lock_partitions`` for the key of job ``job_id`` (read without a row lock:
    a job's key never changes)."""
    connection = connections[db]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(job_sql(connection, _LOCK_JOB_SQL), [LOCK_CLASS, job_id])


def try_lock_partitions(db: str, keys: Iterable[str]) -> set[str]:
    """Take the locks of those ``keys`` no one else holds; return those keys.

    Never waits, so it may be called after locking rows (the claim does).
    """
    wanted = sorted(set(keys))
    if not wanted or connections[db].vendor != "postgresql":
        return set(wanted)
    with connections[db].cursor() as cursor:
        cursor.execute(_TRY_LOCK_SQL, [wanted, LOCK_CLASS])
        return {key for (key,) in cursor.fetchall()}


#: One probe per key, each an index lookup: the head (oldest live job) and
#: an active job, if any. Plain SQL because the ORM cannot join a list of
#: values to correlated subqueries; written for PostgreSQL and SQLite alike.
_HEADS_SQL = """
SELECT k.column1,
    (SELECT j.id FROM {job} j
      WHERE j.namespace = %s AND j.partition_key = k.column1
        AND j.state IN ({live}) {not_yielding}
      ORDER BY j.id LIMIT 1),
    (SELECT j.id FROM {job} j
      WHERE j.namespace = %s AND j.partition_key = k.column1
        AND (j.state = {running} OR (j.state = {cancelled} AND j.lease_expires_at IS NOT NULL))
      LIMIT 1)
FROM (VALUES {values}) AS k
"""


@functools.lru_cache(maxsize=8)
def _not_yielding_sql(vendor: str, alias: str) -> str:
    now = "now()" if vendor == "postgresql" else _SQLITE_NOW
    waiting = f"'{JobState.PENDING.value}', '{JobState.SCHEDULED.value}'"
    return (
        f"AND NOT ({alias}.partition_yield AND {alias}.state IN ({waiting}) "
        f"AND {alias}.run_after > {now})"
    )


def _not_yielding(connection: Any, alias: str) -> str:
    """A filter leaving out jobs that yield their partition while they wait for
    a retry (``@task(partition_retry="yield")``): scheduled (or pending),
    flagged, and not due yet. Such a job is not its key's head, so the next job may run;
    once due it is the head again (and waits for a running job to end).
    Jobs without the flag (every task's by default) are unaffected.
    """
    return _not_yielding_sql(connection.vendor, alias)


#: SQLite's clock in the text form Django stores datetimes in (``%%``: the
#: statements run with parameters).
_SQLITE_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


@dataclass(frozen=True, slots=True)
class Head:
    head_id: int | None  # the oldest live job of the key
    active_id: int | None  # a job of the key that a worker is running

    def runnable(self, job_id: int) -> bool:
        return self.active_id is None and self.head_id == job_id


def partition_heads(db: str, keys: Iterable[str], namespace: str = "") -> dict[str, Head]:
    """Each key's head and active job in ``namespace``, read without locks (the
    claim's first look)."""
    keys = sorted(set(keys))
    if not keys:
        return {}
    connection = connections[db]
    sql = job_sql(connection, _HEADS_SQL).format(
        values=", ".join(["(%s)"] * len(keys)), not_yielding=_not_yielding(connection, "j")
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [namespace, namespace, *keys])
        return {key: Head(head_id, active_id) for key, head_id, active_id in cursor.fetchall()}


#: The demotion: pending -> blocked for the listed jobs that are (still) not
#: runnable, re-checked by this statement itself: a job of the key is active,
#: or an older one is live. Run under the keys' locks, after they were
#: granted, so it sees every promotion committed before. Plain SQL (a
#: correlated EXISTS on the same table); PostgreSQL and SQLite alike.
_DEMOTE_SQL = """
UPDATE {job} SET state = {blocked}
WHERE id IN ({ids}) AND state = {pending} AND EXISTS (
    SELECT 1 FROM {job} o
    WHERE o.namespace = {job}.namespace AND o.partition_key = {job}.partition_key
      AND o.id <> {job}.id
      AND (o.state = {running}
           OR (o.state = {cancelled} AND o.lease_expires_at IS NOT NULL)
           OR (o.state IN ({pending}, {blocked}, {scheduled}) AND o.id < {job}.id {not_yielding}))
)
RETURNING id
"""


def partitions_demote(db: str, jobs: Iterable[tuple[int, str]]) -> set[int]:
    """Demote the pending ``(job id, key)`` that wait behind something; return their ids.

    For the claim, on rows it has locked. Only jobs whose key's lock this
    transaction gets without waiting are touched (a key held by another
    transaction is being changed right now; its jobs stay pending, to be
    looked at again); each is demoted only if, after the lock, a job of its
    key is still active or an older one still live.
    """
    jobs = list(jobs)
    locked = try_lock_partitions(db, [key for _, key in jobs])
    ids = [job_id for job_id, key in jobs if key in locked]
    if not ids:
        return set()
    connection = connections[db]
    sql = job_sql(connection, _DEMOTE_SQL).format(
        ids=", ".join(["%s"] * len(ids)), not_yielding=_not_yielding(connection, "o")
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, ids)
        return {job_id for (job_id,) in cursor.fetchall()}


#: The one promotion: each listed key's oldest live job, if blocked, becomes
#: pending. ``{keys}`` is a table of keys in a column ``partition_key``. Plain
#: SQL because the ORM cannot join a list of values to a correlated subquery;
#: PostgreSQL and SQLite alike.
_PROMOTE_SQL = """
UPDATE {job} SET state = {pending}
WHERE state = {blocked} AND id IN (
    SELECT (SELECT j.id FROM {job} j
             WHERE j.namespace = %s AND j.partition_key = k.partition_key
               AND j.state IN ({live}) {not_yielding}
             ORDER BY j.id LIMIT 1)
    FROM ({keys}) AS k
)
"""


#: ``_PROMOTE_SQL`` and the wake-up of idle workers (``notify``) when it
#: promoted anything, in one statement: PostgreSQL.
_PROMOTE_NOTIFY_SQL = """
WITH promoted AS ({promote} RETURNING 1), n AS (SELECT count(*) AS c FROM promoted)
SELECT c, CASE WHEN c > 0 THEN pg_notify(%s, '') END FROM n
"""


def _promote(db: str, namespace: str, keys_sql: str, params: list[str]) -> int:
    """Run ``_PROMOTE_SQL`` for the keys ``keys_sql`` selects in ``namespace``;
    return how many it promoted."""
    connection = connections[db]
    promote = job_sql(connection, _PROMOTE_SQL).format(
        keys=keys_sql, not_yielding=_not_yielding(connection, "j")
    )
    params = [namespace, *params]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                _PROMOTE_NOTIFY_SQL.format(promote=promote), [*params, notify_channel(namespace)]
            )
            return int(cursor.fetchone()[0])
        cursor.execute(promote, params)
        return cursor.rowcount


def partitions_promote(db: str, keys: Iterable[str | None], namespace: str = "") -> int:
    """Make each key's oldest live job of ``namespace`` pending if it is blocked;
    return how many were.

    Called, in the same transaction and under the keys' locks
    (``lock_partitions``, taken before the transition's own row changes), by
    every transition that may free a key or change its head. One statement
    for any number of keys.
    """
    wanted = sorted({key for key in keys if key})
    if not wanted:
        return 0
    values = " UNION ALL ".join(["SELECT %s AS partition_key"] * len(wanted))
    return _promote(db, namespace, values, wanted)


#: Keys with a blocked job and none active. A key with an active job is not
#: stalled (its blocked head waits for that job, whose end promotes it). The
#: ``IN`` list and ``IS NOT NULL`` repeat the condition of the live jobs'
#: index ``dispatch_job_part_live`` (``{live}``: ``LIVE_STATES``, in its order): SQLite
#: reads a partial index only for a query that repeats each term of its
#: condition; without them it read the whole table.
_STALLED_KEYS_SQL = """
SELECT DISTINCT b.partition_key FROM {job} b
WHERE b.namespace = %s AND b.state IN ({live})
  AND b.partition_key IS NOT NULL AND b.state = {blocked} AND NOT EXISTS (
    SELECT 1 FROM {job} a
    WHERE a.namespace = b.namespace AND a.partition_key = b.partition_key
      AND (a.state = {running} OR (a.state = {cancelled} AND a.lease_expires_at IS NOT NULL))
)
"""


def partitions_promote_stalled(db: str, *, namespace: str = "") -> int:
    """Promote the blocked head of every key of ``namespace`` with nothing active;
    return how many.

    The safety net, run by the leader every ``PURGE_INTERVAL``, which logs a
    warning when it finds something. Since every transition that could stall
    a key takes the key's lock (see the module docstring), it should find
    nothing; a result above zero means a write bypassed the protocol (a
    caller that did not pass a job's partition key, an edit of the table by
    hand). It takes no lock itself: promoting a job that is not runnable
    after all is harmless, the claim checks again before running it.
    """
    return _promote(db, namespace, job_sql(connections[db], _STALLED_KEYS_SQL), [namespace])
