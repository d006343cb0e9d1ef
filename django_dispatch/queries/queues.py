"""Queues as operators see them: backlogs, pauses, limits, and the groups at their cap.

For ``dispatch_queue list``, the admin's queue page and the console: each a
few bounded queries over the indexes of live jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count

from .. import store
from ..conf import queue_limits
from ..core.states import JobState
from ..models import ConcurrencyWait, Job, PausedQueue
from ..store.base import db_now, live_jobs
from ..store.gates.limits import QUEUE_GROUP, queue_starts, starts_in_window
from ..tasks.registry import backend_for, namespace_of


@dataclass
class QueueOverview:
    """One queue as an operator sees it: paused or not, its backlog, its limits."""

    name: str
    paused: bool = False
    paused_at: datetime | None = None
    pending: int = 0
    blocked: int = 0
    running: int = 0
    scheduled: int = 0  # deferred to later, or backing off before a retry
    #: Limits from ``DISPATCH["QUEUES"]`` and how close the queue is to them:
    #: ``concurrency`` (the cap on ``running``), ``rate_limit`` (``"N/Ks"``)
    #: and ``starts`` (in the current window); empty for a queue without limits.
    limits: dict[str, object] = field(default_factory=dict)

    @property
    def concurrency(self) -> object:
        return self.limits.get("concurrency")

    @property
    def rate_limit(self) -> object:
        return self.limits.get("rate_limit")

    @property
    def starts(self) -> object:
        return self.limits.get("starts")


def queue_overview(*, backend: str | None = None) -> list[QueueOverview]:
    """Every queue with live jobs, or paused, or configured: for ``dispatch_queue list``,
    the admin's queue page and the console.

    Two bounded queries: live jobs counted per queue and state (over the
    partial indexes of live jobs), and the paused rows; with rate-limited
    queues (``DISPATCH["QUEUES"]``), their window counters too.
    """
    db = store.database_for(backend)  # the alias's database, as its namespace
    namespace = namespace_of(backend)
    queues: dict[str, QueueOverview] = {}
    dispatch_backend = backend_for(backend or "default")
    for name in getattr(dispatch_backend, "queues", None) or ():
        queues[name] = QueueOverview(name)
    counts = (
        Job.objects.using(db)
        .filter(live_jobs(), namespace=namespace)
        .values("queue_name", "state")
        .annotate(n=Count("id"))
    )
    for row in counts:
        queue = queues.setdefault(row["queue_name"], QueueOverview(row["queue_name"]))
        setattr(queue, row["state"], row["n"])
    for paused in PausedQueue.objects.using(db).filter(namespace=namespace):
        queue = queues.setdefault(paused.queue_name, QueueOverview(paused.queue_name))
        queue.paused, queue.paused_at = True, paused.paused_at
    limits = queue_limits()
    periods = {q: lim.rate_period for q, lim in limits.items() if lim.rate_period is not None}
    starts = queue_starts(db, namespace, periods, db_now(db)) if periods else {}
    for name, limit in limits.items():
        queue = queues.setdefault(name, QueueOverview(name))
        if limit.concurrency is not None:
            queue.limits["concurrency"] = limit.concurrency
        if limit.rate is not None:
            queue.limits["rate_limit"] = limit.rate
            queue.limits["starts"] = starts.get(name, 0)
    return sorted(queues.values(), key=lambda q: q.name)


@dataclass
class GroupAtCap:
    """A concurrency/rate group (task, key) with jobs set aside at its cap."""

    task_path: str
    concurrency_key: str
    limit: int | None  # running at once (None: no such cap)
    rate: str | None  # "N/Ks" (None: no rate limit)
    running: int
    blocked: int
    starts: int | None  # starts in the current window (rate-limited groups)
    since: datetime


def groups_at_cap(*, backend: str | None = None, limit: int = 100) -> list[GroupAtCap]:
    """The groups whose excess jobs wait (``ConcurrencyWait``), oldest first, at most
    ``limit``: for the admin's queue page, ``dispatch_queue list`` and the console.

    Three bounded queries: the wait rows, the running/blocked counts of
    those groups (index ``dispatch_job_conc_next``), and the window starts of
    the rate-limited ones (``dispatch_job_rate_starts``).
    """
    db = store.database_for(backend)  # the alias's database, as its namespace
    namespace = namespace_of(backend)
    waits = list(  # queue groups are shown with their queue (``queue_overview``)
        ConcurrencyWait.objects.using(db)
        .filter(namespace=namespace)
        .exclude(task_path=QUEUE_GROUP)
        .order_by("since")[:limit]
    )
    if not waits:
        return []
    counts: dict[tuple[str, str, str], int] = {}
    rows = (
        Job.objects.using(db)
        .filter(
            namespace=namespace,
            task_path__in={w.task_path for w in waits},
            concurrency_key__in={w.concurrency_key for w in waits},
            state__in=[JobState.RUNNING, JobState.BLOCKED],
        )
        .values_list("task_path", "concurrency_key", "state")
        .annotate(n=Count("id"))
    )
    for task_path, key, state, n in rows:
        counts[(task_path, key, state)] = n
    periods = {
        (w.task_path, w.concurrency_key): w.rate_period
        for w in waits
        if w.rate_limit is not None and w.rate_period is not None
    }
    starts = starts_in_window(db, namespace, periods)
    return [
        GroupAtCap(
            task_path=w.task_path,
            concurrency_key=w.concurrency_key,
            limit=w.limit,
            rate=f"{w.rate_limit}/{w.rate_period}s" if w.rate_limit is not None else None,
            running=counts.get((w.task_path, w.concurrency_key, JobState.RUNNING), 0),
            blocked=counts.get((w.task_path, w.concurrency_key, JobState.BLOCKED), 0),
            starts=starts.get((w.task_path, w.concurrency_key), 0) if w.rate_limit else None,
            since=w.since,
        )
        for w in waits
    ]
