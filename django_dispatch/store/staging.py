"""The stager: deferred jobs become pending when they are due.

A job whose ``run_after`` is in the future waits as ``scheduled``, out of the
claim index (``dispatch_job_claim`` is partial on ``pending``), so a claim is
one ordered scan of due jobs and never reads past a backlog of jobs deferred
to later. ``jobs_stage_due`` moves the due ones to ``pending``:

- on the database clock (``run_after <= now()`` in SQL), like the claim;
- in bounded batches, earliest due first (``dispatch_job_scheduled``: the
  namespace's scheduled jobs by ``run_after``), locking with SKIP LOCKED, so
  two stagers never wait for each other nor stage a job twice;
- with NOTIFY on the namespace's channel when it staged anything
  (PostgreSQL), delivered at commit: the insert trigger only fires on INSERT,
  and idle workers must wake when a deferred job becomes due.

Who stages: every producer, at most once per half poll interval
(``runtime.flow_cache``), just before its claim: in the claim's transaction,
or, before a one-statement wave (``store.wave``, which does not stage), in
a statement of its own committed first; and every direct call of
``store.jobs_claim`` (tests, ``run_now`` aside). Either way the claim that
follows sees what was staged. The reasons and the measurement are in
docs/performance.md ("The scheduled state").

Staging takes no partition lock: it cannot change a key's head (a scheduled
job is live, and so already counted as its key's head, see ``partitions``),
nor free a key. It is not a transition of the limits either: a staged job of
a limited group is sorted out by the claim's gates like any pending one.
"""

from __future__ import annotations

from django.db import connections, transaction
from django.db.models.functions import Now

from ..core.states import JobState
from ..models import Job
from .base import db_alias, job_sql, notify_channel, take_sqlite_write_lock

#: Jobs staged per call at most: bounds the statement, and so the claim's
#: transaction it runs in. A backlog that came due at once is staged over a
#: few claims; each staged job is in the claim index at once.
STAGE_BATCH = 1000

#: The due scheduled jobs of a namespace, earliest first, locked (SKIP LOCKED:
#: another stager or a ``run_now`` holds them), made pending; one NOTIFY when
#: any were. The namespace is a parameter: this runs at most twice a poll
#: interval per worker, off the per-job path.
_STAGE_SQL = """
WITH due AS (
    SELECT id FROM {job}
    WHERE namespace = %s AND state = {scheduled} AND run_after <= now()
    ORDER BY run_after, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
), staged AS (
    UPDATE {job} AS j SET state = {pending}
    FROM due WHERE j.id = due.id AND j.state = {scheduled}
    RETURNING 1
), n AS (SELECT count(*) AS c FROM staged)
SELECT c, CASE WHEN c > 0 THEN pg_notify(%s, '') END FROM n
"""


def jobs_stage_due(*, db: str | None = None, namespace: str = "", limit: int = STAGE_BATCH) -> int:
    """Make up to ``limit`` due scheduled jobs of ``namespace`` pending, earliest due
    first; return how many.

    Inside the caller's transaction if there is one (the claim's), else in
    its own. On SQLite under the write lock (one writer: nothing to skip).
    """
    db = db or db_alias()
    if limit <= 0:
        return 0
    connection = connections[db]
    with transaction.atomic(using=db, savepoint=False):
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    job_sql(connection, _STAGE_SQL), [namespace, limit, notify_channel(namespace)]
                )
                return int(cursor.fetchone()[0])
        take_sqlite_write_lock(db)
        scheduled = Job.objects.using(db).filter(namespace=namespace, state=JobState.SCHEDULED)
        ids = list(
            scheduled.filter(run_after__lte=Now())
            .order_by("run_after", "id")
            .values_list("id", flat=True)[:limit]
        )
        if not ids:
            return 0
        return scheduled.filter(id__in=ids).update(state=JobState.PENDING)


def jobs_stage_now(db: str, ids: list[int]) -> int:
    """Make the listed jobs pending if they are scheduled, due or not; return how many.

    For ``run_now`` (a job named by id runs now, deferred or not), on rows the
    caller has locked, just before their lease: the lease, like every claim,
    takes pending jobs only. A row left pending this way is leased in the
    same transaction, so none stays pending before it is due.
    """
    return (
        Job.objects.using(db)
        .filter(id__in=ids, state=JobState.SCHEDULED)
        .update(state=JobState.PENDING)
    )
