"""Promotion: jobs a limit set aside become pending again as their group's slots free up.

Runs at the start of a claim while any group waits (the caller's
``FlowState.waiting``); see ``gates.limits`` for how the caps hold.
"""

from __future__ import annotations

from django.db import connections
from django.db.models.functions import Now

from ...conf import queue_limits
from ...core.states import LIVE_STATES, WAITING_STATES, JobState
from ...models import ConcurrencyWait, Job
from ..base import CLAIM_ORDER, db_now, job_sql, state_in
from ..types import FlowState
from .limits import QUEUE_GROUP, queue_starts, try_lock_groups, window_start

#: Blocked jobs of a queue whose limits were removed, promoted per claim:
#: bounds the claim's transaction (the next claims go on).
PROMOTE_BUDGET = 1000


#: The promotion, PostgreSQL: per waiting group, its next blocked jobs in claim
#: order (priority desc, run_after, id) up to its free slots (limit - running -
#: pending and due), in one statement. Each group's counts and its blocked jobs
#: are index probes of ``dispatch_job_conc_next``, whose ``priority DESC,
#: run_after, id`` after ``state`` gives that order without a sort of the
#: group's backlog. The ids are an ``ARRAY(...)``, computed once, so the UPDATE
#: finds its rows by primary key: with ``id IN (subquery)`` the planner, which
#: cannot know the rooms, hash-joined the subquery against a scan of the whole
#: job table, finished jobs and all.
#:
#: Only *due* pending jobs take a slot: mostly jobs promoted and not claimed
#: yet, counted so that claims not serving the group's queue do not promote
#: it again and again. A job deferred, or backing off before a retry
#: (run_after in the future), uses no slot until it is due, and then goes
#: through the gate like any other; counting it would keep a freed slot
#: empty until it ran. Counting too few only promotes too many, which the
#: gate blocks again. Running and due pending are two counts, each on one
#: state, so the index's ``state`` column bounds both.
_PROMOTE_PG_SQL = """
WITH w AS (
    SELECT w.task_path, w.concurrency_key, LEAST(
        COALESCE(w."limit" - (
            SELECT count(*) FROM {job} r
            WHERE r.namespace = w.namespace AND r.task_path = w.task_path
              AND r.concurrency_key = w.concurrency_key AND r.state = {running}
        ) - (
            SELECT count(*) FROM {job} d
            WHERE d.namespace = w.namespace AND d.task_path = w.task_path
              AND d.concurrency_key = w.concurrency_key AND d.state = {pending}
              AND d.run_after <= now()
        ), 1 << 30),
        COALESCE(w.rate_limit - (
            SELECT count(*) FROM {job} s
            WHERE s.namespace = w.namespace AND s.task_path = w.task_path
              AND s.concurrency_key = w.concurrency_key AND s.rate_limit IS NOT NULL
              AND s.last_attempted_at >= to_timestamp(
                  floor(extract(epoch FROM now()) / w.rate_period) * w.rate_period)
        ) - (
            SELECT count(*) FROM {job} p
            WHERE p.namespace = w.namespace AND p.task_path = w.task_path
              AND p.concurrency_key = w.concurrency_key AND p.state = {pending}
              AND p.run_after <= now()
        ), 1 << 30)
    ) AS room
    FROM {waits} w WHERE w.namespace = %(ns)s AND w.task_path <> ''
), promoted AS (
    UPDATE {job} SET state = {pending}
    WHERE state = {blocked} AND id = ANY(ARRAY(
        SELECT b.id FROM w, LATERAL (
            SELECT j.id FROM {job} j
            WHERE j.namespace = %(ns)s AND j.task_path = w.task_path
              AND j.concurrency_key = w.concurrency_key AND j.state = {blocked}
            ORDER BY j.priority DESC, j.run_after, j.id LIMIT GREATEST(w.room, 0)
        ) b
    ))
    RETURNING 1
)
SELECT count(*) FROM promoted
"""

#: Groups listed as waiting with no blocked job left (candidates for deletion):
#: each group's next blocked job in the order of ``dispatch_job_conc_next``, so
#: that the index is the only way to it. As a plain ``NOT EXISTS``, PostgreSQL
#: chose a scan of the job table whenever its statistics said that many jobs
#: were blocked, and read every finished job stored before the first blocked
#: one, on every claim while a group waited. ``state IN ({live})`` repeats the
#: index's condition, without which SQLite does not read it at all.
_EMPTY_WAITS_SQL = """
SELECT w.task_path, w.concurrency_key FROM {waits} w
WHERE w.namespace = %s AND w.task_path <> '' AND (
    SELECT j.id FROM {job} j
    WHERE j.namespace = w.namespace AND j.task_path = w.task_path
      AND j.concurrency_key = w.concurrency_key AND j.concurrency_key IS NOT NULL
      AND j.state IN ({live}) AND j.state = {blocked}
    ORDER BY j.priority DESC, j.run_after, j.id LIMIT 1
) IS NULL
"""


def concurrency_promote(db: str, namespace: str, flow: FlowState | None = None) -> int:
    """Promote blocked jobs of waiting groups that have free slots; return how many.

    Then forget groups with no blocked job left: each under its lock (taken
    without waiting; a busy group is left for a later claim), re-checked by
    a statement after the lock (``_EMPTY_WAITS_SQL`` again), so a claim
    blocking a job of the group meanwhile keeps its row. ``flow``, the
    caller's view, is told when no group waits any more.
    """
    connection = connections[db]
    waits_table = connection.ops.quote_name(ConcurrencyWait._meta.db_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                job_sql(connection, _PROMOTE_PG_SQL).format(waits=waits_table), {"ns": namespace}
            )
            promoted = int(cursor.fetchone()[0])
        else:
            promoted = _promote_each(db, namespace)
        empty_sql = job_sql(connection, _EMPTY_WAITS_SQL).format(waits=waits_table)
        cursor.execute(empty_sql, [namespace])
        empty = {(t, k) for t, k in cursor.fetchall()}
    queue_waits = list(
        ConcurrencyWait.objects.using(db)
        .filter(namespace=namespace, task_path=QUEUE_GROUP)
        .values_list("concurrency_key", flat=True)
    )
    if queue_waits:
        more, queues_empty = _promote_queues(db, namespace, queue_waits)
        promoted += more
        empty |= {(QUEUE_GROUP, q) for q in queues_empty}
    if empty:
        locked = try_lock_groups(db, empty)
        with connection.cursor() as cursor:
            cursor.execute(empty_sql, [namespace])  # again, after the locks
            still = {(t, k) for t, k in cursor.fetchall()}
        still |= {
            (t, q) for t, q in locked if t == QUEUE_GROUP and not _queue_blocked(db, namespace, q)
        }
        for t, k in still & locked:
            ConcurrencyWait.objects.using(db).filter(
                namespace=namespace, task_path=t, concurrency_key=k
            ).delete()
        if (
            flow is not None  # this worker's next claims stop promoting at once
            and not ConcurrencyWait.objects.using(db).filter(namespace=namespace).exists()
        ):
            flow.waiting = False
    return promoted


def _queue_blocked(db: str, namespace: str, queue: str) -> bool:
    return (
        Job.objects.using(db)
        .filter(
            state_in(WAITING_STATES), namespace=namespace, flow_queue=queue, state=JobState.BLOCKED
        )
        .exists()
    )


def _promote_queues(db: str, namespace: str, queues: list[str]) -> tuple[int, set[str]]:
    """Promote set-aside jobs of waiting queue groups into their free room, in
    claim order (priority desc, run_after, id): (how many, queues with nothing
    blocked left).

    The room is computed from the limits in settings now: a queue whose
    limits were raised fills the new slots, one whose limits were removed
    lets its jobs go (``PROMOTE_BUDGET`` per claim). Jobs this promoted and
    no claim took yet (pending, marked) count against the room, so claims
    that do not serve the queue do not promote it again and again.
    """
    limits = queue_limits()
    jobs = Job.objects.using(db).filter(namespace=namespace)
    promoted, empty = 0, set()
    now = db_now(db) if any(q in limits and limits[q].rate_limit for q in queues) else None
    for q in queues:
        limit = limits.get(q)
        room = PROMOTE_BUDGET
        if limit is not None:
            # Two counts, each through its own index (an OR of both read the
            # whole table on SQLite): promoted and not yet claimed, and running.
            waiting = jobs.filter(
                state_in(WAITING_STATES), flow_queue=q, state=JobState.PENDING, run_after__lte=Now()
            ).count()
            if limit.concurrency is not None:
                running = jobs.filter(queue_name=q, state=JobState.RUNNING).count()
                room = min(room, limit.concurrency - running - waiting)
            if limit.rate_limit is not None and now is not None:
                started = queue_starts(db, namespace, {q: limit.rate_period}, now).get(q, 0)
                room = min(room, limit.rate_limit - started - waiting)
        if room <= 0:
            continue
        # state_in: SQLite reads ``dispatch_job_queue_next`` only for a query
        # that repeats its condition's IN list (``store.base.state_in``).
        blocked = jobs.filter(state_in(WAITING_STATES), flow_queue=q, state=JobState.BLOCKED)
        ids = list(blocked.order_by(*CLAIM_ORDER).values_list("id", flat=True)[:room])
        if not ids:
            empty.add(q)
            continue
        # By id alone (and still blocked): with the queue's filter, SQLite
        # walked the queue's whole backlog in its index to find these few.
        promoted += jobs.filter(id__in=ids, state=JobState.BLOCKED).update(state=JobState.PENDING)
    return promoted, empty


def _promote_each(db: str, namespace: str) -> int:
    """``_PROMOTE_PG_SQL`` group by group, for SQLite (no LATERAL; one writer anyway)."""
    promoted = 0
    for wait in (
        ConcurrencyWait.objects.using(db).filter(namespace=namespace).exclude(task_path=QUEUE_GROUP)
    ):
        group = Job.objects.using(db).filter(
            namespace=namespace, task_path=wait.task_path, concurrency_key=wait.concurrency_key
        )
        # The group's live jobs through ``dispatch_job_conc_next``, which SQLite
        # reads only for a query that repeats its condition's IN list (state_in).
        live = group.filter(state_in(LIVE_STATES))
        # Pending jobs take a slot only when due (see ``_PROMOTE_PG_SQL``).
        due = live.filter(state=JobState.PENDING, run_after__lte=Now())
        room = 1 << 30
        if wait.limit is not None:
            room = wait.limit - live.filter(state=JobState.RUNNING).count() - due.count()
        if wait.rate_limit is not None and wait.rate_period is not None:
            since = window_start(db_now(db), wait.rate_period)
            started = group.filter(rate_limit__isnull=False, last_attempted_at__gte=since).count()
            room = min(room, wait.rate_limit - started - due.count())
        if room > 0:
            ids = list(
                live.filter(state=JobState.BLOCKED)
                .order_by(*CLAIM_ORDER)
                .values_list("id", flat=True)[:room]
            )
            promoted += group.filter(id__in=ids, state=JobState.BLOCKED).update(
                state=JobState.PENDING
            )
    return promoted
