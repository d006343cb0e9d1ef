"""Flow control in the store: paused queues, and what the claim needs to know of them.

Pausing is a row in ``PausedQueue`` (``queue_pause``/``queue_resume``); the
claim leaves out the jobs of paused queues. Running jobs are not touched and
enqueue keeps inserting: a pause only stops *starts*.

How a worker learns of a pause without paying a query per claim: the claim
reads the namespace's paused set from a per-process cache
(``paused_for_claim``), refreshed by one small SELECT when it is older than
the poll interval, and at once when invalidated: by ``queue_pause`` and
``queue_resume`` in this process, and, on PostgreSQL, by the NOTIFY they
send (payload ``FLOW_PAYLOAD`` on the namespace's channel) to every
listening worker (``runtime.listener`` calls ``forget_paused``). So a pause
takes effect within one poll interval everywhere, and at once on PostgreSQL
with LISTEN on. When nothing is paused the claim statement is the plain one:
the filter is added only for a non-empty set.

The cache entry is stamped with the time *before* its SELECT, and an
invalidation is stamped too; an entry is used only if it was read after the
last invalidation. So a refresh that raced a NOTIFY (its SELECT began before
the pause committed) is never taken for fresh.

Known cost: a paused queue's due jobs stay in the claim index, so a claim
reads past those that come before the runnable ones in claim order (a paused
queue of higher priority than the others, or older). Pausing is meant for
minutes to hours; see docs/operating.md#pausing-queues.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Count, F
from django.db.models.functions import Now

from ..conf import QueueLimit, queue_limits
from ..models.flow import PausedQueue, QueueWindow
from ..models.job import LIVE_STATES, WAITING_STATES
from .base import CLAIM_ORDER, db_now, job_sql, notify_channel, state_in
from .enqueue import CallChunk, JobSpec, jobs_insert

#: The NOTIFY payload that tells listening workers the paused set changed
#: (job inserts notify with an empty payload).
FLOW_PAYLOAD = "flow"

#: ``(db, namespace) -> (read at, paused set, any concurrency group waiting)``;
#: ``read at`` is monotonic, taken before the SELECT.
_cache: dict[tuple[str, str], tuple[float, frozenset[str], bool]] = {}
_invalidated_at = 0.0
_lock = threading.Lock()


def queue_pause(db: str, name: str, *, namespace: str = "") -> bool:
    """Pause queue ``name`` of ``namespace``; True only when this call paused it.

    One INSERT under the unique constraint (in a savepoint, so a caller's
    transaction survives the conflict); on PostgreSQL it also notifies the
    namespace's workers, delivered when the transaction commits.
    """
    try:
        with transaction.atomic(using=db):
            PausedQueue.objects.using(db).create(namespace=namespace, queue_name=name)
    except IntegrityError:
        return False
    _changed(db, namespace)
    return True


def queue_resume(db: str, name: str, *, namespace: str = "") -> bool:
    """Resume queue ``name`` of ``namespace``; True only when this call resumed it.

    The notification also wakes idle workers, so the queue's backlog starts
    at once rather than at the next poll.
    """
    deleted, _ = PausedQueue.objects.using(db).filter(namespace=namespace, queue_name=name).delete()
    if deleted:
        _changed(db, namespace)
    return bool(deleted)


def queues_paused(db: str, *, namespace: str = "") -> set[str]:
    """The paused queues of ``namespace``, read now (not cached)."""
    return set(
        PausedQueue.objects.using(db)
        .filter(namespace=namespace)
        .values_list("queue_name", flat=True)
    )


def _changed(db: str, namespace: str) -> None:
    forget_paused()
    connection = connections[db]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [notify_channel(namespace), FLOW_PAYLOAD])


def forget_paused() -> None:
    """Invalidate every cached paused set: the next claim reads it again.

    Called from the listener thread on a flow notification; safe from any thread.
    """
    global _invalidated_at
    with _lock:
        _invalidated_at = time.monotonic()
        _cache.clear()


def paused_for_claim(db: str, namespace: str, max_age: float) -> frozenset[str]:
    """The paused queues of ``namespace`` as the claim should see them (``flow_state``)."""
    return flow_state(db, namespace, max_age)[0]


def flow_state(db: str, namespace: str, max_age: float) -> tuple[frozenset[str], bool]:
    """(paused queues, whether any concurrency group waits) as the claim should see them.

    From the cache when it is younger than ``max_age`` seconds (the poll
    interval) and was read after the last invalidation; otherwise one small
    SELECT over ``PausedQueue`` and ``ConcurrencyWait`` (``_FLOW_STATE_SQL``),
    which the caller runs inside its claim transaction.
    """
    key = (db, namespace)
    now = time.monotonic()
    entry = _cache.get(key)
    if entry is not None and now - entry[0] < max_age and entry[0] > _invalidated_at:
        return entry[1], entry[2]
    paused, waits = _read_flow_state(db, namespace)
    with _lock:
        if now > _invalidated_at:
            _cache[key] = (now, paused, waits)
    return paused, waits


#: The paused queues, and one NULL row if any concurrency group waits: one
#: statement per refresh. Plain SQL for the LIMIT inside a UNION (SQLite).
_FLOW_STATE_SQL = """
SELECT queue_name FROM {paused} WHERE namespace = %s
UNION ALL
SELECT NULL FROM (SELECT 1 FROM {waits} WHERE namespace = %s LIMIT 1) AS w
"""


def _read_flow_state(db: str, namespace: str) -> tuple[frozenset[str], bool]:
    from ..models import ConcurrencyWait

    connection = connections[db]
    sql = _FLOW_STATE_SQL.format(
        paused=connection.ops.quote_name(PausedQueue._meta.db_table),
        waits=connection.ops.quote_name(ConcurrencyWait._meta.db_table),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [namespace, namespace])
        names = [name for (name,) in cursor.fetchall()]
    return frozenset(n for n in names if n is not None), None in names


def _note_waits(db: str, namespace: str, *, waiting: bool = True) -> None:
    """This process just listed a waiting group (or removed the last one): its
    next claims promote (or stop promoting) without waiting for a refresh."""
    with _lock:
        entry = _cache.get((db, namespace))
        if entry is not None:
            _cache[(db, namespace)] = (entry[0], entry[1], waiting)


def claimable_queues(queues: Sequence[str], paused: frozenset[str]) -> tuple[list[str], list[str]]:
    """The claim's queue filter with pauses applied: (queues to keep, queues to leave out).

    A worker serving named queues simply drops the paused ones from its list
    (no new SQL); one serving every queue leaves the paused ones out with
    ``NOT (queue_name = ANY(...))`` (``PAUSED_FILTER_SQL``). When every
    queue a worker serves is paused, the first list is empty although
    ``queues`` was not: the caller must claim nothing (empty means "every
    queue" to the claim query).
    """
    if not paused:
        return list(queues), []
    if queues:
        return [q for q in queues if q not in paused], []
    return [], sorted(paused)


#: The fused claim statement's filter for ``claimable_queues``' second list.
PAUSED_FILTER_SQL = " AND NOT (queue_name = ANY(%(paused)s))"


def jobs_insert_limited(
    spec: JobSpec, chunks: Sequence[CallChunk], *, db: str
) -> tuple[list[int], list[Any]]:
    """``enqueue_many``'s insert for a task with a concurrency limit: through the ORM.

    The raw INSERT of ``jobs_insert_calls`` names a fixed list of columns;
    keeping limited jobs off it leaves the plain hot path exactly as it was.
    All or nothing, like that function.
    """
    jobs = [spec.new_job(args, kwargs) for chunk in chunks for args, kwargs in chunk.values]
    with transaction.atomic(using=db, savepoint=False):
        jobs_insert(jobs, db=db)
    return [job.pk for job in jobs], [job.enqueued_at for job in jobs]


# --- concurrency limits ----------------------------------------------------------
#
# A *group* is (namespace, task_path, concurrency_key) of jobs with a
# ``concurrency_limit``. How the cap holds with any number of claimers:
#
# - Admission (``ConcurrencyGate``, in the claim): before leasing a group's
#   job, the claim takes the group's transaction-level advisory lock without
#   waiting (a group locked by another claimer is skipped this time, its jobs
#   left pending), counts the group's running jobs in a statement after the
#   lock was granted, and admits at most ``limit - running`` of its jobs
#   (fewer by those this claim admitted already). Running jobs are only ever
#   added by admissions, which the lock serialises per group, so no two
#   claims can both fill the last slot; jobs ending meanwhile only make the
#   count conservative. The fused PostgreSQL claim never leases a limited
#   row itself (``concurrency_limit IS NULL`` in its lease), so every limited
#   job goes through the gate.
# - Excess jobs of a group at its cap are *blocked* (out of the claim index,
#   as partitions do) and the group is listed in ``ConcurrencyWait``, in that
#   transaction, under the lock. They are not read again by claims.
# - Promotion (``concurrency_promote``, at the start of a claim while any
#   group waits): for every waiting group, as many of its blocked jobs as it
#   has free slots (limit - running - pending and due; a deferred job holds
#   no slot) become pending again in the claim's own order (priority desc,
#   run_after, id: a set-aside job of priority 10 is not stuck behind a
#   group's older backlog of priority 0), in one statement; the same claim
#   then reads them. Promoting too many is
#   harmless (the gate blocks the excess again); a group row is deleted only
#   under its lock, by a statement after the lock, when no blocked job of it
#   is left, so a group with blocked jobs always has its row and never stalls.
# - On SQLite (one writer at a time) the locks are not needed and do nothing.
#
# Cost when unused: the claim asks the per-process flow cache whether any
# group waits (refreshed once per poll interval, like the paused set); no
# limited job in a claim's rows means no gate at all.
#
# Queue groups (``DISPATCH["QUEUES"]``): every job of a limited queue that
# has no limit, partition key or resource need of its own (those are
# refused at enqueue, ``flow_options.check_queue_of``) belongs to its
# queue's group, ``("", queue_name)`` (no task path is empty). Membership
# and limits are read from settings at claim time, not stamped on the row:
# a deploy that changes a queue's limits applies them at the next claim of
# each worker, to jobs already enqueued too, and a deploy that removes them
# lets the queue's blocked jobs go (promotion finds no limit). The same
# lock, count-after-lock, block and promote steps apply, with the queue's
# own counts: running jobs of the queue (over the running jobs' index
# ``dispatch_job_lease``), starts in the window from the ``QueueWindow``
# counter the gate keeps under the lock, and the jobs it set aside or
# promoted through ``Job.flow_queue`` (index ``dispatch_job_queue_next``).
# The fused PostgreSQL claim leaves the limited queues' rows to the gate
# (``LIMITED_FILTER_SQL``, added only when some queue has limits).

#: The first key of the group locks (``pg_try_advisory_xact_lock(int, int)``),
#: apart from the partition locks' ``LOCK_CLASS``.
CONCURRENCY_LOCK_CLASS = 0x44534343  # "DSCC"

_TRY_LOCK_GROUPS_SQL = """
SELECT g.t, g.k FROM unnest(%s::text[], %s::text[]) AS g(t, k)
WHERE pg_try_advisory_xact_lock(%s, hashtext(g.t || chr(31) || g.k))
"""

_RUNNING_SQL = """
SELECT task_path, concurrency_key, count(*) FROM {job}
WHERE namespace = %s AND state = {running} AND concurrency_key IS NOT NULL
  AND ({groups})
GROUP BY task_path, concurrency_key
"""

#: Starts (claims) of rate-limited groups since their windows began.
_STARTS_SQL = """
SELECT task_path, concurrency_key, count(*) FROM {job}
WHERE namespace = %s AND rate_limit IS NOT NULL AND ({groups})
GROUP BY task_path, concurrency_key
"""

Group = tuple[str, str]  # (task_path, concurrency_key); ("", queue) for a queue group

#: The task path of a queue group, in ``Group`` and in ``ConcurrencyWait``.
QUEUE_GROUP = ""
#: Blocked jobs of a queue whose limits were removed, promoted per claim:
#: bounds the claim's transaction (the next claims go on).
PROMOTE_BUDGET = 1000

#: The fused claim's lease leaves rows of limited queues to the gate.
LIMITED_FILTER_SQL = " AND NOT (queue_name = ANY(%(limited)s))"


def _try_lock_groups(db: str, groups: set[Group]) -> set[Group]:
    if not groups or connections[db].vendor != "postgresql":
        return set(groups)
    ts, ks = zip(*sorted(groups), strict=True)
    with connections[db].cursor() as cursor:
        cursor.execute(_TRY_LOCK_GROUPS_SQL, [list(ts), list(ks), CONCURRENCY_LOCK_CLASS])
        return {(t, k) for t, k in cursor.fetchall()}


def _running(db: str, namespace: str, groups: set[Group]) -> dict[Group, int]:
    """Running jobs per group: an index read, of ``dispatch_job_conc_next`` or
    (PostgreSQL's usual choice, as few jobs run at once) the running jobs'
    ``dispatch_job_lease``, never a scan of the table."""
    if not groups:
        return {}
    connection = connections[db]
    where = " OR ".join(["(task_path = %s AND concurrency_key = %s)"] * len(groups))
    sql = job_sql(connection, _RUNNING_SQL).format(groups=where)
    params: list[Any] = [namespace]
    for t, k in sorted(groups):
        params += [t, k]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {(t, k): n for t, k, n in cursor.fetchall()}


def window_start(now: datetime, period: int) -> datetime:
    """The start of the fixed window of ``period`` seconds holding ``now``
    (windows aligned on the Unix epoch, so every worker agrees)."""
    epoch = now.timestamp()
    return datetime.fromtimestamp(epoch - epoch % period, tz=UTC)


def starts_in_window(db: str, namespace: str, periods: dict[Group, int]) -> dict[Group, int]:
    """Starts per rate-limited group in its current window (``dispatch_job_rate_starts``)."""
    if not periods:
        return {}
    connection = connections[db]
    now = db_now(db)
    where = " OR ".join(
        ["(task_path = %s AND concurrency_key = %s AND last_attempted_at >= %s)"] * len(periods)
    )
    sql = job_sql(connection, _STARTS_SQL).format(groups=where)
    params: list[Any] = [namespace]
    for (t, k), period in sorted(periods.items()):
        params += [t, k, window_start(now, period)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {(t, k): n for t, k, n in cursor.fetchall()}


class ConcurrencyGate:
    """One claim's view of the concurrency groups it met (see the notes above).

    Built only when a claim's candidates include a limited job, so plain
    claims never make one.
    """

    def __init__(
        self, db: str, namespace: str, queues: dict[str, QueueLimit] | None = None
    ) -> None:
        self.db, self.namespace = db, namespace
        self.queues = queues or {}  # limited queues (``flow_options.queue_limits``)
        self.locked: set[Group] = set()
        self.busy: set[Group] = set()  # locked by another claimer: skip this time
        self.room: dict[Group, int] = {}  # slots left to admit in this claim
        self.now: datetime | None = None  # the claim's database clock, for queue windows

    def sort(
        self, rows: list[dict[str, Any]], free: int
    ) -> tuple[list[dict[str, Any]], list[int], int]:
        """Split runnable ``rows`` (claim order): (admitted, passed ids, number blocked).

        Walks the rows in order until ``free`` are admitted: unlimited rows
        are admitted, limited ones while their group has room; a limited row
        whose group is at its cap is blocked, one whose group another claimer
        holds is passed. Rows after the ``free``-th admitted one are returned
        unchecked at the end of the admitted list (the caller passes them).
        """
        first: dict[Group, dict[str, Any]] = {}
        for r in reversed(rows):
            if (g := self.group_of(r)) is not None:
                first[g] = r
        fresh = set(first) - self.locked - self.busy
        if fresh:
            got = _try_lock_groups(self.db, fresh)
            self.busy |= fresh - got
            tasks = {g for g in got if g[0] != QUEUE_GROUP}
            capped = {g for g in tasks if first[g]["concurrency_limit"] is not None}
            rated = {
                g: first[g]["rate_period"] for g in tasks if first[g]["rate_limit"] is not None
            }
            running = _running(self.db, self.namespace, capped)
            starts = starts_in_window(self.db, self.namespace, rated)
            self.locked |= got
            for task in tasks:
                row, room = first[task], 1 << 30
                if row["concurrency_limit"] is not None:
                    room = row["concurrency_limit"] - running.get(task, 0)
                if row["rate_limit"] is not None:
                    room = min(room, row["rate_limit"] - starts.get(task, 0))
                self.room[task] = room
            queues = {g[1] for g in got - tasks}
            if queues:
                self.now = self.now or first[(QUEUE_GROUP, min(queues))].get("db_now")
                self.room.update(self._queue_room(queues))
        admitted: list[dict[str, Any]] = []
        passed: list[int] = []
        over: list[dict[str, Any]] = []
        rest: list[dict[str, Any]] = []
        started: dict[str, int] = {}  # admissions per rate-limited queue
        for row in rows:
            group = self.group_of(row) if len(admitted) < free else None
            if len(admitted) >= free:
                rest.append(row)
            elif group is None:
                admitted.append(row)
            elif group in self.busy:
                passed.append(row["id"])
            elif self.room[group] > 0:
                self.room[group] -= 1
                admitted.append(row)
                if group[0] == QUEUE_GROUP and self.queues[group[1]].rate_limit is not None:
                    started[group[1]] = started.get(group[1], 0) + 1
            else:
                over.append(row)
        self._count_starts(started)
        return admitted + rest, passed, self._block(over)

    def group_of(self, row: dict[str, Any]) -> Group | None:
        """The group whose limits gate ``row``, or None (admitted freely)."""
        if row.get("concurrency_key") is not None:
            return _group(row)
        if (
            row["queue_name"] in self.queues
            and row.get("partition_key") is None
            and not row.get("resources")
        ):
            return (QUEUE_GROUP, row["queue_name"])
        return None

    def _queue_room(self, queues: set[str]) -> dict[Group, int]:
        """Slots left per locked queue group: its caps minus its running jobs and
        its starts in the current window (read after the lock was granted)."""
        limits = {q: self.queues[q] for q in queues}
        capped = {q for q, lim in limits.items() if lim.concurrency is not None}
        running = queue_running(self.db, self.namespace, capped)
        rated = {q: lim.rate_period for q, lim in limits.items() if lim.rate_period is not None}
        starts: dict[str, int] = {}
        if rated:
            self.now = self.now or db_now(self.db)
            starts = queue_starts(self.db, self.namespace, rated, self.now)
        room: dict[Group, int] = {}
        for q, lim in limits.items():
            left = 1 << 30
            if lim.concurrency is not None:
                left = lim.concurrency - running.get(q, 0)
            if lim.rate_limit is not None:
                left = min(left, lim.rate_limit - starts.get(q, 0))
            room[(QUEUE_GROUP, q)] = left
        return room

    def _count_starts(self, started: dict[str, int]) -> None:
        """Add this claim's admissions to the queues' window counters (under their locks)."""
        for q, n in started.items():
            period = self.queues[q].rate_period
            assert period is not None and self.now is not None
            since = window_start(self.now, period)
            rows = QueueWindow.objects.using(self.db).filter(namespace=self.namespace, queue_name=q)
            if rows.filter(window_start=since).update(starts=F("starts") + n):
                continue
            if not rows.update(window_start=since, starts=n):
                QueueWindow.objects.using(self.db).create(
                    namespace=self.namespace, queue_name=q, window_start=since, starts=n
                )

    def _block(self, rows: list[dict[str, Any]]) -> int:
        """Block capped jobs (pending -> blocked) and list their groups as waiting."""
        if not rows:
            return 0
        from ..core.states import JobState
        from ..models import ConcurrencyWait, Job

        pending = Job.objects.using(self.db).filter(state=JobState.PENDING)
        tasks = [r["id"] for r in rows if r.get("concurrency_key") is not None]
        queues = [r["id"] for r in rows if r.get("concurrency_key") is None]
        blocked = 0
        if tasks:
            blocked += pending.filter(id__in=tasks).update(state=JobState.BLOCKED)
        if queues:  # marked with their queue: found again by dispatch_job_queue_next
            blocked += pending.filter(id__in=queues).update(
                state=JobState.BLOCKED, flow_queue=F("queue_name")
            )
        waits: dict[Group, ConcurrencyWait] = {}
        for r in rows:
            if (group := self.group_of(r)) is None:  # pragma: no cover - only grouped rows
                continue
            if group[0] == QUEUE_GROUP:
                limit = self.queues[group[1]]
                waits[group] = ConcurrencyWait(
                    namespace=self.namespace,
                    task_path=QUEUE_GROUP,
                    concurrency_key=group[1],
                    limit=limit.concurrency,
                    rate_limit=limit.rate_limit,
                    rate_period=limit.rate_period,
                )
            else:
                waits[group] = ConcurrencyWait(
                    namespace=self.namespace,
                    task_path=r["task_path"],
                    concurrency_key=r["concurrency_key"] or "",
                    limit=r["concurrency_limit"],
                    rate_limit=r["rate_limit"],
                    rate_period=r["rate_period"],
                )
        ConcurrencyWait.objects.using(self.db).bulk_create(
            list(waits.values()), ignore_conflicts=True
        )
        _note_waits(self.db, self.namespace)
        return blocked


def _group(row: dict[str, Any]) -> Group:
    return (row["task_path"], row["concurrency_key"] or "")


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


def concurrency_promote(db: str, namespace: str) -> int:
    """Promote blocked jobs of waiting groups that have free slots; return how many.

    Then forget groups with no blocked job left: each under its lock (taken
    without waiting; a busy group is left for a later claim), re-checked by
    a statement after the lock (``_EMPTY_WAITS_SQL`` again), so a claim
    blocking a job of the group meanwhile keeps its row.
    """
    from ..models import ConcurrencyWait

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
        locked = _try_lock_groups(db, empty)
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
        if not ConcurrencyWait.objects.using(db).filter(namespace=namespace).exists():
            _note_waits(db, namespace, waiting=False)  # claims stop promoting at once
    return promoted


def _queue_blocked(db: str, namespace: str, queue: str) -> bool:
    from ..core.states import JobState
    from ..models import Job

    return (
        Job.objects.using(db)
        .filter(
            state_in(WAITING_STATES), namespace=namespace, flow_queue=queue, state=JobState.BLOCKED
        )
        .exists()
    )


def queue_running(db: str, namespace: str, queues: set[str]) -> dict[str, int]:
    """Running jobs per queue (the running jobs' index ``dispatch_job_lease``)."""
    if not queues:
        return {}
    from ..core.states import JobState
    from ..models import Job

    rows = (
        Job.objects.using(db)
        .filter(namespace=namespace, state=JobState.RUNNING, queue_name__in=sorted(queues))
        .values_list("queue_name")
        .annotate(n=Count("id"))
        .order_by()
    )
    return dict(rows)


def queue_starts(
    db: str, namespace: str, periods: Mapping[str, int | None], now: datetime
) -> dict[str, int]:
    """Starts per rate-limited queue in its current window (``QueueWindow``)."""
    rows = QueueWindow.objects.using(db).filter(namespace=namespace, queue_name__in=sorted(periods))
    counts: dict[str, int] = {}
    for q, since, starts in rows.values_list("queue_name", "window_start", "starts"):
        period = periods.get(q)
        if period is not None and since == window_start(now, period):
            counts[q] = starts
    return counts


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
    from ..core.states import JobState
    from ..models import Job

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
    from ..core.states import JobState
    from ..models import ConcurrencyWait, Job

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
