"""The limits gate: concurrency and rate limits of task groups and of queues.

How the caps hold with any number of claimers (admission under a group's
lock, excess jobs set aside, promotion when slots free up) is told below;
the promotion itself is ``gates.promotion``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.db import connections
from django.db.models import Count, F

from ...conf import QueueLimit
from ...core.states import JobState
from ...models import ConcurrencyWait, Job
from ...models.flow import QueueWindow
from ..base import db_now, job_sql
from ..types import FlowState

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
# Cost when unused: the claim asks the caller's ``FlowState`` whether any
# group waits (a worker refreshes it once per poll interval, like the paused
# set); no limited job in a claim's rows means no gate at all.
#
# Queue groups (``DISPATCH["QUEUES"]``): every job of a limited queue that
# has no limit, partition key or resource need of its own (those are
# refused at enqueue, ``tasks.options.check_queue_of``) belongs to its
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

#: The fused claim's lease leaves rows of limited queues to the gate.
LIMITED_FILTER_SQL = " AND NOT (queue_name = ANY(%(limited)s))"


def try_lock_groups(db: str, groups: set[Group]) -> set[Group]:
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


def starts_in_window(
    db: str, namespace: str, periods: dict[Group, int], now: datetime | None = None
) -> dict[Group, int]:
    """Starts per rate-limited group in the window holding ``now`` (default: the
    database's clock now; ``dispatch_job_rate_starts``).

    A claim passes its own clock, the one its leases stamp as
    ``last_attempted_at``: read again here, it could fall in the next window
    while the claim's starts are stamped in this one, which they would then
    overfill."""
    if not periods:
        return {}
    connection = connections[db]
    now = now or db_now(db)
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
        self,
        db: str,
        namespace: str,
        queues: Mapping[str, QueueLimit] | None = None,
        flow: FlowState | None = None,
    ) -> None:
        self.db, self.namespace = db, namespace
        self.queues = queues or {}  # limited queues (``conf.queue_limits``)
        self.flow = flow  # told when jobs are set aside
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
            got = try_lock_groups(self.db, fresh)
            self.busy |= fresh - got
            tasks = {g for g in got if g[0] != QUEUE_GROUP}
            capped = {g for g in tasks if first[g]["concurrency_limit"] is not None}
            rated = {
                g: first[g]["rate_period"] for g in tasks if first[g]["rate_limit"] is not None
            }
            running = _running(self.db, self.namespace, capped)
            if rated:
                self.now = self.now or next(iter(first.values())).get("db_now")
            starts = starts_in_window(self.db, self.namespace, rated, self.now)
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
        if self.flow is not None:  # this worker's next claims promote first
            self.flow.waiting = True
        return blocked


def _group(row: dict[str, Any]) -> Group:
    return (row["task_path"], row["concurrency_key"] or "")


def queue_running(db: str, namespace: str, queues: set[str]) -> dict[str, int]:
    """Running jobs per queue (the running jobs' index ``dispatch_job_lease``)."""
    if not queues:
        return {}
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
