"""The console's reads of the window's finished jobs: the per-minute chart, and the
wait and run time percentiles per queue from the newest of them.

On PostgreSQL the percentiles are worked out where the sample is read
(``percentile_disc``, one row per queue): sending the ``TIMING_SAMPLE``
rows' durations to be parsed, grouped and sorted here cost more than the
rest of the overview's reads together. SQLite has no ordered-set
aggregates: it sends the sample, and the same nearest-rank percentiles are
taken here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import Count, DurationField, ExpressionWrapper, F, QuerySet
from django.db.models.functions import Coalesce, Greatest, TruncMinute
from django.utils import timezone

from ..core.states import FINISHED_STATES, JobState
from ..models import Job
from ..store.base import state_in

if TYPE_CHECKING:
    from .console import QueueRows

#: Finished jobs whose wait and run times make the percentiles.
TIMING_SAMPLE = 2_000
FINISHED_SHOWN = (JobState.SUCCEEDED, JobState.FAILED)
#: The percentiles shown: the median and the 95th.
QUANTILES = (0.5, 0.95)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def finished_per_minute(namespace: str, since: datetime, db: str) -> list[Any]:
    """Finished jobs per (queue, state, minute) since ``since``: the index's range only."""
    return list(
        finished_in_window(namespace, since, db)
        .annotate(minute=TruncMinute("finished_at", tzinfo=UTC))
        .values("queue_name", "state", "minute")
        .annotate(n=Count("pk"))
    )


def finished_in_window(namespace: str, since: datetime, db: str) -> QuerySet[Job]:
    """The window's finished jobs that the chart counts, through ``dispatch_job_finished``."""
    return (
        Job.objects.using(db)
        .filter(
            state_in(FINISHED_STATES),  # the index's condition, for SQLite
            namespace=namespace,
            state__in=FINISHED_SHOWN,
            finished_at__gte=since,
        )
        .order_by()
    )


def finished_by_minute(namespace: str, since: datetime, db: str) -> list[tuple[str, str, int, int]]:
    """``(queue, state, minute, n)``: finished jobs since ``since``, ``minute`` counted
    in whole minutes from ``since``'s (UTC), so the chart's bars are 1 to 60.

    On PostgreSQL the minute is a number the server works out: a page reads
    hundreds of these rows, and a truncated timestamp costs a datetime made,
    then made aware, per row; the number is the same minute, as the epoch's
    whole minutes (UTC). The window's rows (thousands a minute on a busy
    site) are grouped by queue and ``date_bin`` minute, the failed ones
    counted by a filter: hashing the state and working the minute's number
    out per row cost more than reading the rows; the few groups are then
    numbered and split by state. (``date_bin``: PostgreSQL 14, the oldest
    Django 5.2 supports; binned from the epoch, its minutes are UTC's.)
    """
    epoch = EPOCH.replace(tzinfo=since.tzinfo)  # naive without USE_TZ, as ``since``
    since_minute = (since - epoch) // MINUTE
    if connections[db].vendor != "postgresql" or timezone.is_naive(since):
        return [
            (r["queue_name"], r["state"], (r["minute"] - epoch) // MINUTE - since_minute, r["n"])
            for r in finished_per_minute(namespace, since, db)
        ]
    rows = finished_in_window(namespace, since, db).values("queue_name", "state", "finished_at")
    sql, params = rows.query.get_compiler(using=db).as_sql()
    succeeded, failed = (str(state.value) for state in FINISHED_SHOWN)
    with connections[db].cursor() as cursor:
        cursor.execute(
            "SELECT g.queue_name, floor(date_part('epoch', g.minute) / 60)::bigint - %s, "
            "g.failed, g.n FROM (SELECT s.queue_name, "
            "date_bin(INTERVAL '1 minute', s.finished_at, TIMESTAMPTZ '1970-01-01 00:00:00+00') "
            "AS minute, COUNT(*) FILTER (WHERE s.state = %s) AS failed, COUNT(*) AS n "
            f"FROM ({sql}) s GROUP BY 1, 2) g",
            (since_minute, failed, *params),
        )
        found = cursor.fetchall()
    return [
        (queue, state, minute, n)
        for queue, minute, failures, total in found
        for state, n in ((succeeded, total - failures), (failed, failures))
        if n
    ]


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def newest(
    namespace: str, since: datetime, db: str, states: tuple[str, ...] = FINISHED_SHOWN
) -> QuerySet[Any]:
    """The window's finished jobs in ``states``, newest first, with their wait and
    run durations worked out by the database."""
    ready = Greatest("enqueued_at", Coalesce("deferred_until", "enqueued_at"))
    return (
        Job.objects.using(db)
        .filter(
            state_in(FINISHED_STATES),  # dispatch_job_finished's condition, for SQLite
            namespace=namespace,
            state__in=states,
            finished_at__gte=since,
            started_at__isnull=False,
        )
        .order_by("-finished_at")
        .annotate(
            wait=ExpressionWrapper(F("started_at") - ready, output_field=DurationField()),
            run=ExpressionWrapper(
                F("finished_at") - Coalesce("last_attempted_at", "started_at"),
                output_field=DurationField(),
            ),
        )
    )


def sample(namespace: str, since: datetime, db: str) -> QuerySet[Job, tuple[Any, ...]]:
    """The newest finished jobs' (queue, wait, run)."""
    return newest(namespace, since, db).values_list("queue_name", "wait", "run")[:TIMING_SAMPLE]


def timing_sample(namespace: str, since: datetime, db: str) -> list[tuple[Any, ...]]:
    """The sample's rows: (queue, wait, run)."""
    return list(sample(namespace, since, db))


def newest_sql(namespace: str, since: datetime, db: str) -> tuple[str, list[Any]]:
    """The sample on PostgreSQL: each state's newest rows off its own range of
    ``dispatch_job_finished`` (namespace, state, finished_at), read backwards
    and merged, so the statement reads about the sample's rows. One range
    over both states holds the whole window (thousands of rows a minute on a
    busy site), which it must read and sort to find the newest."""
    parts, params = [], []
    for state in FINISHED_SHOWN:
        part = newest(namespace, since, db, (state,)).values_list(
            "queue_name", "wait", "run", "finished_at"
        )[:TIMING_SAMPLE]
        sql, part_params = part.query.get_compiler(using=db).as_sql()
        parts.append(f"({sql})")
        params.extend(part_params)
    union = " UNION ALL ".join(parts)
    return (
        f"SELECT u.queue_name, u.wait, u.run FROM ({union}) u "
        f"ORDER BY u.finished_at DESC LIMIT {TIMING_SAMPLE}",
        params,
    )


def queue_percentiles(
    namespace: str, since: datetime, db: str
) -> dict[str, tuple[list[timedelta], list[timedelta]]]:
    """Per queue, the sample's wait and run percentiles (``QUANTILES``), on PostgreSQL:
    ``percentile_disc`` is the nearest rank, as ``percentile``."""
    sql, params = newest_sql(namespace, since, db)
    quantiles = ", ".join(str(q) for q in QUANTILES)
    with connections[db].cursor() as cursor:
        cursor.execute(
            f"SELECT s.queue_name, "
            f"percentile_disc(ARRAY[{quantiles}]) WITHIN GROUP (ORDER BY s.wait), "
            f"percentile_disc(ARRAY[{quantiles}]) WITHIN GROUP (ORDER BY s.run) "
            f"FROM ({sql}) s GROUP BY s.queue_name",
            params,
        )
        return {queue: (waits, runs) for queue, waits, runs in cursor.fetchall()}


def add_timings(rows: QueueRows, namespace: str, since: datetime, db: str) -> None:
    """Wait and run time percentiles per queue, from the timing sample. A negative
    duration (a retry started before its deferral ended) counts as 0: clamping
    each value or the percentile is the same, the clamp keeping the order."""
    if connections[db].vendor == "postgresql":
        for name, (waits, runs) in queue_percentiles(namespace, since, db).items():
            queue = rows[name]
            queue.wait_p50, queue.wait_p95 = (max(w.total_seconds(), 0.0) for w in waits)
            queue.run_p50, queue.run_p95 = (max(r.total_seconds(), 0.0) for r in runs)
        return
    wait_values: dict[str, list[float]] = defaultdict(list)
    run_values: dict[str, list[float]] = defaultdict(list)
    for queue_name, wait, run in timing_sample(namespace, since, db):
        wait_values[queue_name].append(max(wait.total_seconds(), 0.0))
        run_values[queue_name].append(max(run.total_seconds(), 0.0))
    for name, values in wait_values.items():
        queue = rows[name]
        queue.wait_p50, queue.wait_p95 = (percentile(values, q) for q in QUANTILES)
        queue.run_p50, queue.run_p95 = (percentile(run_values[name], q) for q in QUANTILES)
