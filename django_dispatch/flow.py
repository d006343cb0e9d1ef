"""Flow control for operators and applications: pause and resume queues.

``pause_queue(name)`` stops new starts of the queue's jobs on every worker of
the namespace (within one poll interval; at once on PostgreSQL with LISTEN),
while running jobs finish and enqueue keeps working; ``resume_queue(name)``
lets the backlog drain. The state is a database row, so it holds across
restarts and hosts. The namespace is that of a TASKS alias (``backend``,
default ``"default"``), as for ``drain()`` and ``rundispatch --backend``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count

from . import store
from .conf import queue_limits
from .core.states import JobState
from .models import ConcurrencyWait, Job, PausedQueue
from .store import flow as flow_store
from .store.base import db_now, live_jobs
from .tasks.enqueue import backend_for, namespace_for

__all__ = [
    "GroupAtCap",
    "QueueOverview",
    "groups_at_cap",
    "pause_queue",
    "paused_queues",
    "queue_overview",
    "resume_queue",
]

#: Longest queue name (``Job.queue_name``).
MAX_QUEUE_NAME = 100


def _namespace(backend: str | None) -> str:
    if backend is None:
        default = backend_for("default")
        return default.namespace if default is not None else ""
    return namespace_for(backend)  # an unknown alias: ValueError naming the right ones


def _checked(name: object, backend: str | None, *, listed: bool = True) -> str:
    """``name`` if it can be a queue of ``backend``; a ValueError saying why not otherwise.

    With ``listed`` (pausing), a backend whose ``QUEUES`` lists its queues
    accepts only those: pausing a misspelt name would silently pause nothing.
    """
    if not isinstance(name, str) or not name or len(name) > MAX_QUEUE_NAME:
        raise ValueError(
            f"queue name must be a non-empty string of at most {MAX_QUEUE_NAME} "
            f"characters, got {name!r}."
        )
    if not listed:
        return name
    dispatch_backend = backend_for(backend or "default")
    allowed = getattr(dispatch_backend, "queues", None)
    if allowed and name not in allowed:
        raise ValueError(
            f"queue {name!r} is not one of TASKS[{backend or 'default'!r}]['QUEUES'] "
            f"({sorted(allowed)}); pause one of those."
        )
    return name


def pause_queue(name: str, *, backend: str | None = None) -> bool:
    """Pause queue ``name``: True only when this call paused it (False: it already was).

    Its jobs stay pending and keep being enqueued; none starts until
    ``resume_queue``. Jobs already running finish. Runs in the caller's
    transaction if there is one (the pause takes effect at its commit).
    """
    name = _checked(name, backend)
    return flow_store.queue_pause(store.db_alias(), name, namespace=_namespace(backend))


def resume_queue(name: str, *, backend: str | None = None) -> bool:
    """Resume queue ``name``: True only when this call resumed it (False: it was not paused).

    Any paused name is accepted, listed in ``TASKS[...]["QUEUES"]`` or not:
    a deploy may drop a queue that was paused, and its pause row must still
    be removable (else its jobs never start). Deleting a row that exists is
    always safe; a misspelt name resumes nothing and says so (False).
    """
    name = _checked(name, backend, listed=False)
    return flow_store.queue_resume(store.db_alias(), name, namespace=_namespace(backend))


def paused_queues(*, backend: str | None = None) -> set[str]:
    """The names of the paused queues (read from the database now)."""
    return flow_store.queues_paused(store.db_alias(), namespace=_namespace(backend))


@dataclass
class QueueOverview:
    """One queue as an operator sees it: paused or not, its backlog, its limits."""

    name: str
    paused: bool = False
    paused_at: datetime | None = None
    pending: int = 0
    blocked: int = 0
    running: int = 0
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
    db = store.db_alias()
    namespace = _namespace(backend)
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
    starts = flow_store.queue_starts(db, namespace, periods, db_now(db)) if periods else {}
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
    db = store.db_alias()
    namespace = _namespace(backend)
    waits = list(  # queue groups are shown with their queue (``queue_overview``)
        ConcurrencyWait.objects.using(db)
        .filter(namespace=namespace)
        .exclude(task_path=flow_store.QUEUE_GROUP)
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
    starts = flow_store.starts_in_window(db, namespace, periods)
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
