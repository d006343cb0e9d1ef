"""Prometheus metrics (optional extra: ``pip install "django-dispatch[prometheus]"``).

Two kinds of numbers, from two places:

* **What happened to jobs**, counted in-process where it happened, with no
  database query: ``dispatch_jobs_total{state, task, queue}`` (``enqueued``
  in the process that enqueued; ``started``, ``succeeded``, ``failed``,
  ``retried``, ``cancelled``, ``lost``, ``interrupted``, ``released`` and
  ``worker_lost`` in the worker), the histograms
  ``dispatch_job_queue_wait_seconds`` (from the moment a job became due, its
  enqueue, ``run_after`` or the end of a retry's backoff, to its claim, on
  the database clock) and ``dispatch_job_run_seconds`` (one attempt's task
  code), and the gauges ``dispatch_worker_slots`` and
  ``dispatch_worker_busy_slots`` of this ``rundispatch``.
* **The cluster as a whole**, from one bounded query set (``cluster_snapshot``:
  live jobs grouped by queue and state through their partial indexes, and
  the small worker table) run by the *leader* once per ``RECLAIM_INTERVAL``,
  never per scrape and never on every worker: ``dispatch_queue_jobs{queue,
  state}``, ``dispatch_queue_due_jobs{queue}``,
  ``dispatch_queue_oldest_waiting_seconds{queue}``, ``dispatch_workers``,
  ``dispatch_slots`` and ``dispatch_busy_slots``. Only the leader's endpoint
  exports them (a worker that is not the leader exports none), so
  ``max without (instance)`` over all endpoints gives one value.
  ``django_dispatch.views.metrics`` serves the same gauges from a web
  process, from the same query, cached for ``VIEW_CACHE_SECONDS``.

``rundispatch --metrics-port`` serves them (``exposition``). With ``--processes`` the
supervisor serves one endpoint for all its children through
prometheus_client's multiprocess mode: it creates a directory for the
children's value files (``PROMETHEUS_MULTIPROC_DIR``, unless already set)
before forking, serves their sum, marks a dead child's live gauges gone,
and removes the directory when it exits. The leader child publishes the
cluster snapshot there as a JSON file (``FileSink``) that the supervisor's
endpoint reads while it is fresh.

Without prometheus-client installed nothing here is imported or done:
``AVAILABLE`` is False and every hook starts by checking it (or ``WORKER``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import installed

if TYPE_CHECKING:
    from ..store import ClaimedJob

#: prometheus-client is installed (checked without importing it).
AVAILABLE = installed("prometheus_client")

#: This process's worker metrics, set by ``enable_worker``; None: not counted.
WORKER: JobMetrics | None = None

#: How long the metrics view reuses its cluster snapshot (seconds).
VIEW_CACHE_SECONDS = 5.0
#: A published snapshot older than this many publishing intervals is not exported.
STALE_INTERVALS = 3
#: The file the leader child writes the cluster snapshot to (multiprocess mode).
CLUSTER_FILE = "dispatch_cluster.json"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: What ``--metrics-addr ""`` (the default) listens on.
ALL_INTERFACES = "0.0.0.0"

_WAIT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
)  # fmt: skip
_RUN_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800,
    3600,
)  # fmt: skip


class JobMetrics:
    """This process's counters and histograms (one instance per process)."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        registry = registry or REGISTRY
        self.jobs = Counter(
            "dispatch_jobs",
            "Jobs by what happened to them: enqueued (where enqueued), started, succeeded, "
            "failed, retried, cancelled, lost, interrupted, released, worker_lost (in workers).",
            ["state", "task", "queue"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "dispatch_job_queue_wait_seconds",
            "From the moment a job became due (enqueue, run_after, end of a retry's backoff) "
            "to its claim, on the database clock.",
            ["task", "queue"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.run = Histogram(
            "dispatch_job_run_seconds",
            "How long one attempt's task code ran, whatever its outcome.",
            ["task", "queue"],
            buckets=_RUN_BUCKETS,
            registry=registry,
        )
        self.slots = Gauge(
            "dispatch_worker_slots",
            "Job threads of this rundispatch (all its processes).",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.busy_slots = Gauge(
            "dispatch_worker_busy_slots",
            "Jobs this rundispatch holds now (all its processes), as of its last heartbeat.",
            multiprocess_mode="livesum",
            registry=registry,
        )
        # Label children by key: ``labels()`` takes a lock and builds a tuple.
        self._counts: dict[tuple[str, str, str], Any] = {}
        self._waits: dict[tuple[str, str], Any] = {}
        self._runs: dict[tuple[str, str], Any] = {}

    def count(self, state: str, task: str, queue: str, n: int = 1) -> None:
        key = (state, task, queue)
        child = self._counts.get(key)
        if child is None:
            child = self._counts[key] = self.jobs.labels(state, task, queue)
        child.inc(n)

    def started(self, claimed: ClaimedJob) -> None:
        row = claimed.row
        task, queue = row["task_path"], row["queue_name"]
        self.count("started", task, queue)
        key = (task, queue)
        child = self._waits.get(key)
        if child is None:
            child = self._waits[key] = self.queue_wait.labels(task, queue)
        waited: timedelta = claimed.claimed_at - row["run_after"]
        child.observe(max(0.0, waited.total_seconds()))

    def ran(self, claimed: ClaimedJob, seconds: float) -> None:
        key = (claimed.row["task_path"], claimed.row["queue_name"])
        child = self._runs.get(key)
        if child is None:
            child = self._runs[key] = self.run.labels(*key)
        child.observe(seconds)

    def finished(self, task: str, queue: str, outcome: str) -> None:
        self.count(outcome, task, queue)

    def heartbeat(self, *, busy: int, slots: int) -> None:
        self.busy_slots.set(busy)
        self.slots.set(slots)


_metrics: JobMetrics | None = None
_metrics_lock = threading.Lock()


def job_metrics() -> JobMetrics:
    """This process's ``JobMetrics``, made at first use (needs prometheus-client)."""
    global _metrics
    if _metrics is None:
        with _metrics_lock:
            if _metrics is None:
                _metrics = JobMetrics()
    return _metrics


def enqueued(task_path: str, queue: str, count: int = 1) -> None:
    """Count enqueued jobs in this process (call only when ``AVAILABLE``)."""
    job_metrics().count("enqueued", task_path, queue, count)


# --- the cluster snapshot ------------------------------------------------------------------


@dataclass
class ClusterSnapshot:
    """Live jobs and workers, as one query set saw them."""

    taken_at: float  # time.time()
    max_age: float  # seconds after which it is not exported any more
    #: (queue, state, count) for pending, blocked and running jobs.
    jobs: list[tuple[str, str, int]] = field(default_factory=list)
    #: Per queue: jobs due now (pending, or scheduled and not staged yet), and
    #: the age of the oldest of them (seconds).
    due: dict[str, int] = field(default_factory=dict)
    oldest_waiting: dict[str, float] = field(default_factory=dict)
    workers: int = 0
    slots: int = 0
    busy_slots: int = 0

    def fresh(self) -> bool:
        return time.time() - self.taken_at <= self.max_age


def cluster_snapshot(
    *, max_age: float, live_within: float, db: str | None = None
) -> ClusterSnapshot:
    """Two statements: live jobs by queue and state (over the live rows only, as
    ``dispatch_status``), and the worker rows seen within ``live_within`` seconds.

    Finished jobs are never read, so the cost follows the backlog, not the
    table's history.
    """
    from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Q, Sum
    from django.db.models.functions import Now

    from ..core.states import JobState
    from ..models import Job, Worker
    from ..store import db_alias
    from ..store.base import live_jobs, now_plus

    db = db or db_alias()
    # Due: pending, or scheduled and not staged yet (no worker stages while
    # none runs, and those jobs are overdue all the same).
    due = Q(state__in=(JobState.PENDING, JobState.SCHEDULED), run_after__lte=Now())
    waited = ExpressionWrapper(Now() - F("run_after"), output_field=DurationField())
    rows = (
        Job.objects.using(db)
        .filter(live_jobs())
        .values("queue_name", "state")
        .annotate(n=Count("id"), due=Count("id", filter=due), oldest=Max(waited, filter=due))
        .order_by()
    )
    snapshot = ClusterSnapshot(taken_at=time.time(), max_age=max_age)
    for row in rows:
        queue = row["queue_name"]
        snapshot.jobs.append((queue, str(row["state"]), row["n"]))
        if row["due"]:
            snapshot.due[queue] = snapshot.due.get(queue, 0) + row["due"]
        if row["oldest"] is not None:
            age = max(0.0, row["oldest"].total_seconds())
            snapshot.oldest_waiting[queue] = max(age, snapshot.oldest_waiting.get(queue, 0.0))
    workers = (
        Worker.objects.using(db)
        .filter(last_seen_at__gte=now_plus(-live_within))
        .aggregate(n=Count("id"), slots=Sum("concurrency"), busy=Sum("running_jobs"))
    )
    snapshot.workers = workers["n"] or 0
    snapshot.slots = workers["slots"] or 0
    snapshot.busy_slots = workers["busy"] or 0
    return snapshot


class MemorySink:
    """Where the leader's snapshot waits for the next scrape, in this process."""

    def __init__(self) -> None:
        self.snapshot: ClusterSnapshot | None = None

    def publish(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot

    def clear(self) -> None:
        self.snapshot = None

    def read(self) -> ClusterSnapshot | None:
        snapshot = self.snapshot
        return snapshot if snapshot is not None and snapshot.fresh() else None


class FileSink:
    """The same, through a file that the supervisor's endpoint reads (``--processes``).

    Written by rename, so a reader never sees half a file. A child that is
    no longer the leader removes the file only if it wrote it; a leader that
    died leaves a file that goes stale and stops being exported.
    """

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, CLUSTER_FILE)

    def publish(self, snapshot: ClusterSnapshot) -> None:
        data = {"pid": os.getpid(), **asdict(snapshot)}
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w") as out:
            json.dump(data, out)
        os.replace(temporary, self.path)

    def clear(self) -> None:
        try:
            with open(self.path) as f:
                mine = json.load(f).get("pid") == os.getpid()
        except (OSError, ValueError):
            return
        if mine:
            with contextlib.suppress(OSError):
                os.remove(self.path)

    def read(self) -> ClusterSnapshot | None:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        data.pop("pid", None)
        data["jobs"] = [tuple(entry) for entry in data["jobs"]]
        snapshot = ClusterSnapshot(**data)
        return snapshot if snapshot.fresh() else None


Sink = MemorySink | FileSink

#: Where this worker's leader duty publishes (set by ``enable_worker``).
SINK: Sink | None = None


class ClusterCollector:
    """Exports the cluster gauges of whatever snapshot ``read`` returns."""

    def __init__(self, read: Callable[[], ClusterSnapshot | None]) -> None:
        self.read = read

    def describe(self) -> list[Any]:
        return []  # registering must not query the database

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        snapshot = self.read()
        if snapshot is None:
            return
        jobs = GaugeMetricFamily(
            "dispatch_queue_jobs", "Live jobs per queue and state.", labels=["queue", "state"]
        )
        for queue, state, n in snapshot.jobs:
            jobs.add_metric([queue, state], n)
        due = GaugeMetricFamily(
            "dispatch_queue_due_jobs",
            "Jobs due now and not started (pending, or scheduled and not staged yet), per queue.",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "dispatch_queue_oldest_waiting_seconds",
            "How long the oldest due job of each queue (pending or scheduled) has been waiting.",
            labels=["queue"],
        )
        for queue in sorted({queue for queue, _, _ in snapshot.jobs}):
            due.add_metric([queue], snapshot.due.get(queue, 0))
            oldest.add_metric([queue], snapshot.oldest_waiting.get(queue, 0.0))
        yield jobs
        yield due
        yield oldest
        yield GaugeMetricFamily(
            "dispatch_workers", "Worker processes that heartbeat in time.", value=snapshot.workers
        )
        yield GaugeMetricFamily(
            "dispatch_slots", "Job threads of those workers.", value=snapshot.slots
        )
        yield GaugeMetricFamily(
            "dispatch_busy_slots", "Jobs those workers hold.", value=snapshot.busy_slots
        )
        yield GaugeMetricFamily(
            "dispatch_cluster_snapshot_timestamp_seconds",
            "When the cluster gauges were read from the database (Unix time).",
            value=snapshot.taken_at,
        )


# --- serving ----------------------------------------------------------------------------


def enable_worker(sink: Sink) -> JobMetrics:
    """Count this process's jobs, and publish the cluster snapshot to ``sink`` when leader."""
    global WORKER, SINK
    metrics = job_metrics()
    SINK = sink
    WORKER = metrics
    return metrics


def disable_worker() -> None:
    global WORKER, SINK
    WORKER = None
    SINK = None


def publish_cluster(leader: bool, *, interval: float, live_within: float, db: str) -> None:
    """The leader's duty, every ``interval`` seconds: read and publish the snapshot."""
    sink = SINK
    if sink is None:
        return
    if not leader:
        sink.clear()
        return
    sink.publish(
        cluster_snapshot(max_age=interval * STALE_INTERVALS + 1.0, live_within=live_within, db=db)
    )
