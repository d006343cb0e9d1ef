"""Reads that run again and again read the live rows, not the history kept beside them.

A job table keeps every finished job for ``JOB_RETENTION`` (7 days by default),
with its usage records: on a busy site, millions of rows that no worker needs.
The leader's purges, the cluster gauges, ``dispatch_status``, the console's
overview, ``flow.queue_overview`` and an enqueue with ``unique_for`` all run
over and over; each must read its partial index's range, not the table. Each is
counted beside 300 and then 30,000 finished jobs (``tests.database_work``): a
read of the table costs about 100 times as much the second time.

Found by counting: on PostgreSQL the live counts of the gauges and of
``queue_overview`` read the whole table (``state IN (...)`` matches no partial
index: each has its own condition); on SQLite so did every read here whose
index condition is an ``IN`` list (SQLite needs the list repeated as literals).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dispatch import flow, store
from django_dispatch.conf import get_settings
from django_dispatch.core.states import JobState
from django_dispatch.models import Job, JobUsage
from django_dispatch.observability import metrics
from django_dispatch.queries import console, status
from django_dispatch.store.dead_letters import purge_past_retention
from django_dispatch.store.enqueue import recently_finished
from django_dispatch.store.usage import usage_purge
from tests.database_work import database_work
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

FINISHED = [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]


def _history(count: int) -> None:
    """``count`` jobs finished two hours ago (kept: within retention; outside the
    console's one-hour window), each with its usage record."""
    then = timezone.now() - timedelta(hours=2)
    Job.objects.bulk_create(
        Job(
            task_path="tests.testapp.tasks.add",
            args=[1, 1],
            state=FINISHED[i % 3],
            idempotency_key=f"k{i}" if i % 2 else None,
            partition_key=f"p{i}" if i % 5 == 0 else None,
            enqueued_at=then,
            started_at=then,
            finished_at=then,
        )
        for i in range(count)
    )
    JobUsage.objects.bulk_create(
        JobUsage(
            job_id=i,
            task_path="t",
            attempt=1,
            outcome="succeeded",
            started_at=then,
            finished_at=then,
        )
        for i in range(count)
    )
    if connection.vendor == "postgresql":  # SQLite would keep the statistics for later tests
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def _reads() -> dict[str, Callable[[], object]]:
    cfg = get_settings()
    keyed = Job(namespace="", task_path="tests.testapp.tasks.add", idempotency_key="k1")
    return {
        "the jobs' and dead letters' purge": lambda: purge_past_retention(
            cfg.JOB_RETENTION,
            dead_letter_retention=cfg.DEAD_LETTER_RETENTION,
            batch=cfg.PURGE_BATCH,
            max_seconds=5,
        ),
        "the usage purge": lambda: usage_purge(
            older_than=cfg.USAGE_RETENTION, batch=cfg.PURGE_BATCH, max_seconds=5
        ),
        "unique_for's look-up": lambda: recently_finished(keyed, 60, db="default"),
        "the cluster gauges": lambda: metrics.cluster_snapshot(max_age=1, live_within=30),
        "dispatch_status": lambda: status.snapshot(""),
        "flow.queue_overview": flow.queue_overview,
        "the console's overview": lambda: console.overview(""),
    }


def _work() -> dict[str, int]:
    found = {}
    for name, read in _reads().items():
        read()  # plans and catalog reads made once, outside the count
        with database_work() as work:
            read()
        found[name] = work.amount
    return found


def _live_counts() -> dict[str, tuple[int, int, int, int]]:
    return {
        row.name: (row.pending, row.blocked, row.running, row.scheduled)
        for row in flow.queue_overview()
    }


def test_repeated_reads_cost_the_same_beside_a_hundred_times_the_history():
    # Live jobs of every kind, so the counts have something to find.
    tasks.add.enqueue(1, 1)  # pending, due
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)  # deferred
    tasks.add.using(partition_key="live").enqueue(1, 3)
    tasks.add.using(partition_key="live").enqueue(1, 4)
    store.jobs_claim(worker_id="w", queues=(), limit=3, lease_seconds=30)  # running, blocked
    live = _live_counts()
    assert live == {"default": (0, 1, 2, 1)}, live

    _history(300)
    few = _work()
    _history(29_700)
    many = _work()
    grew = {name: (few[name], many[name]) for name in few if many[name] > 3 * few[name] + 30}
    assert not grew, f"work beside 300 vs 30,000 finished jobs: {grew}"
    assert _live_counts() == live
