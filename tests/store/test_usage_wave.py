"""A completion wave's usage records (#16, #20): its winners each get one, its losers none.

On PostgreSQL the records are written by the statement that finishes the
wave (a data-modifying CTE: the INSERT reads the fenced UPDATE's RETURNING
rows), elsewhere by a second statement after it. Either way a job whose
fenced write lost (cancelled, or taken over by another worker) must get no
record from this wave, and each winner exactly one.
"""

from __future__ import annotations

import random
import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_dispatch import cancel, store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job, JobUsage
from django_dispatch.runtime import metering
from django_dispatch.runtime.completer import BatchCompleter
from django_dispatch.runtime.executor import Outcome
from django_dispatch.runtime.running import RunningJob
from django_dispatch.store.finish import _finish_many_orm, _finish_many_pg
from django_dispatch.store.usage import UsageEntry, usage_record_many
from tests.concurrency import run_concurrently
from tests.conftest import postgres_only
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

DB = "default"
WORKER = "w-wave"


def _claim(worker: str = WORKER, limit: int = 100, lease: float = 30) -> list[store.ClaimedJob]:
    return store.jobs_claim(worker_id=worker, queues=(), limit=limit, lease_seconds=lease)


def _finished(claimed: store.ClaimedJob) -> RunningJob:
    """A job as its thread hands it to the wave: measured, succeeded with a value."""
    metering.start(claimed.id, thread_cpu=True).stop()
    return RunningJob(
        claimed=claimed, lease_seconds=30, finished=Outcome("succeeded", claimed.id * 10)
    )


def _records(job_ids) -> dict[int, list[tuple[str, int, str]]]:
    """{job id: [(outcome, attempt, worker id), ...]} for each of ``job_ids``."""
    rows = JobUsage.objects.filter(job_id__in=job_ids).order_by("id")
    by_job: dict[int, list[tuple[str, int, str]]] = {int(i): [] for i in job_ids}
    for job_id, outcome, attempt, worker in rows.values_list(
        "job_id", "outcome", "attempt", "worker_id"
    ):
        by_job[job_id].append((outcome, attempt, worker))
    return by_job


def test_a_wave_records_each_winner_once_and_no_loser():
    # Taken over: this worker's lease expired, the reclaim returned the job to
    # the queue (its own worker_lost record) and another worker holds it now.
    taken = int(tasks.add.enqueue(0, 0).id)
    (stale,) = _claim(limit=1, lease=0.01)
    time.sleep(0.05)
    assert store.jobs_rescue_expired(max_worker_lost=3)[0] == [taken]
    (other,) = _claim("w-other", limit=1)
    assert other.id == taken
    ids = [int(tasks.add.enqueue(i, i).id) for i in range(5)]
    claimed = _claim()
    assert sorted(c.id for c in claimed) == ids
    cancelled = ids[1]
    assert cancel(cancelled)
    batch = [_finished(c) for c in [stale, *claimed]]
    try:
        with CaptureQueriesContext(connection) as queries, transaction.atomic():
            won = BatchCompleter.write(batch, DB)
    finally:
        for c in [stale, *claimed]:
            metering.forget(c.id, metering.METERS.get(c.id))
    winners = set(ids) - {cancelled}
    assert won == winners
    records = _records([taken, *ids])
    for job_id in winners:
        assert records[job_id] == [("succeeded", 1, WORKER)], job_id
        assert Job.objects.get(pk=job_id).return_value == job_id * 10
    assert records[cancelled] == []
    assert records[taken] == [("worker_lost", 1, WORKER)]  # the reclaim's, none from the wave
    assert JobUsage.objects.count() == len(winners) + 1
    measured = JobUsage.objects.filter(job_id__in=winners, wall_seconds__isnull=False)
    assert measured.count() == len(winners)
    assert Job.objects.get(pk=taken).state == JobState.RUNNING  # still the other worker's
    statements = [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    if connection.vendor == "postgresql":
        # One round trip for the wave: the UPDATE and its records in one statement.
        assert len(statements) == 1 and "INSERT INTO" in statements[0], statements


@postgres_only
def test_a_wave_racing_cancels_records_exactly_the_jobs_it_finished():
    """Cancels race the wave's write from another connection; whichever commits
    first wins each job. Counted afterwards: a record for every job the wave
    finished and only for those, whatever the interleaving."""
    rng = random.Random(20)
    cancels_won = cancels_lost = 0
    for round_ in range(15):
        ids = [int(tasks.add.enqueue(round_, i).id) for i in range(8)]
        claimed = _claim()
        batch = [_finished(c) for c in claimed]
        targets = rng.sample(ids, 4)
        delay = rng.uniform(0, 0.006)

        def write_wave(batch=batch, delay=delay) -> set[int]:
            time.sleep(delay)
            with transaction.atomic():
                won = BatchCompleter.write(batch, DB)
                time.sleep(0.002)  # hold the rows: late cancels wait for the commit
            return won

        def cancel_some(targets=targets) -> list[bool]:
            done = []
            for job_id in targets:
                done.append(cancel(job_id))
                time.sleep(0.001)
            return done

        won, cancelled = run_concurrently(write_wave, cancel_some, together=True)
        for c in claimed:
            metering.forget(c.id, metering.METERS.get(c.id))
        states = dict(Job.objects.filter(id__in=ids).values_list("id", "state"))
        records = _records(ids)
        for job_id in ids:
            if job_id in won:
                assert states[job_id] == JobState.SUCCEEDED
                assert records[job_id] == [("succeeded", 1, WORKER)], job_id
            else:
                assert states[job_id] == JobState.CANCELLED
                assert records[job_id] == [], job_id
        assert set(ids) - won == {j for j, ok in zip(targets, cancelled, strict=True) if ok}
        assert JobUsage.objects.filter(job_id__in=ids).count() == len(won)
        cancels_won += sum(cancelled)
        cancels_lost += len(targets) - sum(cancelled)
    # Both orders happened, so the counts above checked both.
    assert cancels_won and cancels_lost, (cancels_won, cancels_lost)


@postgres_only
def test_the_wave_statement_records_what_its_orm_twin_would():
    """``_FINISH_MANY_USAGE_SQL`` beside ``_finish_many_orm`` + ``usage_record_many``,
    on the same rows (each in a rolled-back transaction): same winners, same records."""
    ids = [int(tasks.add.enqueue(i, i).id) for i in range(4)]
    claimed = {c.id: c for c in _claim()}
    Job.objects.filter(pk=ids[0]).update(lease_epoch=99)  # taken over meanwhile
    results = [(claimed[i].lease, {"v": i}) for i in ids]
    # What the worker measured varies (a wall clock unknown, resources held);
    # what the lease says is the row's, as metering.entry builds it, and the
    # statement reads it from the row.
    Job.objects.filter(pk=ids[3]).update(resources={"gpu": 1})
    usage = {
        i: UsageEntry(
            job_id=i,
            namespace="",
            task_path=claimed[i].row["task_path"],
            queue_name=claimed[i].row["queue_name"],
            attempt=claimed[i].row["attempts"],
            worker_id=WORKER,
            host="h",
            outcome="succeeded",
            started_at=claimed[i].claimed_at,
            wall_seconds=None if i == ids[1] else 0.1 * i,
            cpu_seconds=0.25,
            peak_rss_mb=12.5,
            resources={"gpu": 1} if i == ids[3] else None,
        )
        for i in ids
    }
    fields = [f.name for f in JobUsage._meta.concrete_fields if f.name not in ("id", "finished_at")]

    def raw():
        return _finish_many_pg(results, DB, usage)

    def orm():
        winners = _finish_many_orm(results, DB)
        usage_record_many([usage[i] for i in winners], db=DB, raw=False)
        return winners

    outcomes = []
    for path in (raw, orm):
        with transaction.atomic():
            winners = path()
            rows = list(JobUsage.objects.order_by("job_id").values(*fields))
            finished = dict(Job.objects.filter(id__in=winners).values_list("id", "finished_at"))
            clocks = set(JobUsage.objects.values_list("finished_at", flat=True))
            outcomes.append((winners, rows))
            transaction.set_rollback(True)
        # One statement, one clock (the record's is the statement's, never
        # before its job's, which is the transaction's).
        assert len(clocks) == 1 and min(clocks) >= max(finished.values())
    assert not JobUsage.objects.exists()
    (raw_winners, raw_rows), (orm_winners, orm_rows) = outcomes
    assert raw_winners == orm_winners == dict.fromkeys(ids[1:])
    assert raw_rows == orm_rows and [r["job_id"] for r in raw_rows] == ids[1:]
