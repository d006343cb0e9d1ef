"""Usage records (#16): one per attempt, written with its outcome; reads; retention."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_dispatch import store, usage
from django_dispatch.conf import get_settings
from django_dispatch.core.states import JobState
from django_dispatch.models import Job, JobUsage
from django_dispatch.runtime.maintenance import Maintenance
from django_dispatch.testing import drain
from tests.testapp import resource_tasks as rt
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_success_gets_one_record_with_its_measurements():
    ids = [rt.burn.enqueue(0.2).id for _ in range(3)]
    assert drain(worker_id="w-usage", concurrency=3) == 3
    rows = list(JobUsage.objects.order_by("job_id"))
    assert [r.job_id for r in rows] == sorted(int(i) for i in ids)
    for row in rows:
        job = Job.objects.get(pk=row.job_id)
        assert row.outcome == "succeeded" and row.attempt == 1
        assert row.task_path == "tests.testapp.resource_tasks.burn"
        assert row.queue_name == "default" and row.worker_id == "w-usage" and row.host
        assert row.started_at == job.last_attempted_at <= row.finished_at
        assert 0.2 <= row.wall_seconds < 5
        # The thread's own CPU, never more than its wall time (three busy
        # threads share the GIL, so each gets about a third of it) ...
        assert 0 < row.cpu_seconds <= row.wall_seconds + 0.05
        assert row.peak_rss_mb > 10
    # ... and together about the wall time they ran side by side.
    assert sum(row.cpu_seconds for row in rows) > 0.1


def test_failed_attempts_each_get_a_record():
    enqueued = rt.fails.enqueue()
    drain()
    assert Job.objects.get(pk=enqueued.id).state == JobState.FAILED
    rows = list(JobUsage.objects.filter(job_id=enqueued.id).order_by("attempt"))
    assert [(r.attempt, r.outcome) for r in rows] == [(1, "failed"), (2, "failed")]
    assert all(r.wall_seconds is not None and r.cpu_seconds is not None for r in rows)


def test_a_timed_out_attempt_gets_a_record():
    enqueued = rt.overruns.enqueue(2.0)  # over its 0.3 s timeout
    drain()
    assert Job.objects.get(pk=enqueued.id).state == JobState.FAILED
    (row,) = JobUsage.objects.filter(job_id=enqueued.id)
    assert row.outcome == "timed_out" and row.attempt == 1
    assert 2.0 <= row.wall_seconds < 5  # it returned within its grace period: all of it


def test_async_tasks_record_no_thread_cpu():
    enqueued = tasks.async_add.enqueue(1, 2)
    drain()
    (row,) = JobUsage.objects.filter(job_id=enqueued.id)
    assert row.outcome == "succeeded" and row.cpu_seconds is None and row.wall_seconds >= 0


def test_a_lost_worker_attempt_is_recorded_by_the_reclaim():
    enqueued = tasks.add.enqueue(1, 2)
    (claimed,) = store.jobs_claim(
        worker_id="doomed-host:1:ab", queues=(), limit=1, lease_seconds=0.01
    )
    time.sleep(0.05)
    requeued, _failed = store.jobs_rescue_expired(max_worker_lost=3)
    assert requeued == [int(enqueued.id)]
    (row,) = JobUsage.objects.filter(job_id=enqueued.id)
    assert row.outcome == "worker_lost" and row.attempt == 1
    assert row.worker_id == "doomed-host:1:ab" and row.host == "doomed-host"
    assert row.started_at == claimed.claimed_at and row.wall_seconds is None
    drain()  # the next attempt gets its own record
    assert list(
        JobUsage.objects.filter(job_id=enqueued.id)
        .order_by("attempt")
        .values_list("outcome", "attempt")
    ) == [("worker_lost", 1), ("succeeded", 2)]


def test_a_lost_fenced_write_records_nothing():
    """The attempt whose write lost was recorded by whoever took the job over."""
    enqueued = tasks.add.enqueue(1, 2)
    (claimed,) = store.jobs_claim(worker_id="w", queues=(), limit=1, lease_seconds=30)
    Job.objects.filter(pk=enqueued.id).update(lease_epoch=99)  # reclaimed meanwhile
    from django_dispatch.runtime import completer, executor, metering

    metering.start(claimed.id, thread_cpu=True)
    outcome = executor.Outcome(kind="failed", exception=ValueError("x"), errors=[])
    assert completer.persist(claimed, outcome, give_up_after=1) is False
    assert not JobUsage.objects.exists()


def test_records_newest_first_per_task_and_summary():
    for _ in range(4):
        rt.burn.enqueue(0.01)
    tasks.add.enqueue(1, 1)
    drain()
    every = usage.records()
    assert len(every) == 5
    assert [r.finished_at for r in every] == sorted((r.finished_at for r in every), reverse=True)
    assert len(usage.records(rt.burn)) == 4
    assert len(usage.records("tests.testapp.tasks.add")) == 1
    assert len(usage.records(limit=2)) == 2
    assert usage.records(since=timezone.now() + timedelta(minutes=1)) == []
    summary = usage.summary(rt.burn)
    assert summary["count"] == 4
    assert 0.01 <= summary["wall_p50"] <= summary["wall_p95"]
    assert summary["cpu_p50"] <= summary["cpu_p95"]
    assert summary["peak_rss_mb_p95"] > 0
    empty = usage.summary("no.such.task")
    assert empty == {
        "count": 0,
        "wall_p50": None,
        "wall_p95": None,
        "cpu_p50": None,
        "cpu_p95": None,
        "peak_rss_mb_p95": None,
    }


def test_retention_purge_in_batches(settings):
    for _ in range(5):
        tasks.add.enqueue(1, 1)
    drain()
    old = timezone.now() - timedelta(days=40)
    JobUsage.objects.filter(id__in=list(JobUsage.objects.values_list("id", flat=True)[:3])).update(
        finished_at=old
    )
    settings.DISPATCH = {"PURGE_BATCH": 2, "USAGE_RETENTION": 30 * 86400}
    maintenance = Maintenance("leader", get_settings(), store.db_alias())
    maintenance.leader = True
    maintenance.purge()
    assert JobUsage.objects.count() == 2
    assert not JobUsage.objects.filter(finished_at__lt=timezone.now() - timedelta(days=30)).exists()


@pytest.mark.slow
def test_a_real_worker_records_failures_and_timeouts(start_worker):
    ok, bad, late = rt.burn.enqueue(0.05), rt.fails.enqueue(), rt.overruns.enqueue(1.0)
    worker = start_worker("--burst", "--concurrency", "2", overrides={"TIMEOUT_GRACE": 5})
    assert worker.popen.wait(timeout=60) == 0, worker.output()
    outcomes = dict(JobUsage.objects.values_list("job_id", "outcome").filter(attempt=1))
    assert outcomes == {int(ok.id): "succeeded", int(bad.id): "failed", int(late.id): "timed_out"}
    assert JobUsage.objects.filter(job_id=bad.id, attempt=2, outcome="failed").exists()
    assert JobUsage.objects.count() == 4


def test_the_raw_wave_insert_stores_what_the_orm_would():
    """PostgreSQL's one-statement insert of a wave, beside its ORM twin."""
    from django.db import connection

    from django_dispatch.store.usage import UsageEntry, usage_record_many

    if connection.vendor != "postgresql":
        pytest.skip("the raw statement is PostgreSQL's")
    now = timezone.now()
    entries = [
        UsageEntry(
            job_id=i,
            namespace="ns",
            task_path="a.b",
            queue_name="q",
            attempt=2,
            worker_id="w",
            host="h",
            outcome="succeeded",
            started_at=now,
            wall_seconds=None if i == 1 else 1.5,
            cpu_seconds=0.25,
            peak_rss_mb=None,
            resources=None if i == 1 else {"memory_mb": 3},
        )
        for i in (1, 2)
    ]
    usage_record_many(entries, raw=True)
    usage_record_many(entries, raw=False)
    # finished_at: each statement's own now(), checked apart.
    fields = [f.name for f in JobUsage._meta.concrete_fields if f.name not in ("id", "finished_at")]
    raw, orm = (
        list(JobUsage.objects.filter(id__in=ids).order_by("job_id").values(*fields))
        for ids in (
            JobUsage.objects.order_by("id").values_list("id", flat=True)[:2],
            JobUsage.objects.order_by("id").values_list("id", flat=True)[2:],
        )
    )
    assert raw == orm and len(raw) == 2
    assert not JobUsage.objects.filter(finished_at__isnull=True).exists()


def test_an_attempt_measured_by_no_meter_here_still_gets_a_record():
    """A recycled process's successor settles its predecessor's timeouts: the
    measurements went with the old process, the record says None."""
    from django_dispatch.runtime import completer, executor

    enqueued = tasks.add.enqueue(1, 2)
    (claimed,) = store.jobs_claim(worker_id="w", queues=(), limit=1, lease_seconds=30)
    outcome = executor.Outcome(kind="failed", exception=ValueError("x"), errors=[])
    assert completer.persist(claimed, outcome, give_up_after=1, signal=False)
    (row,) = JobUsage.objects.filter(job_id=enqueued.id)
    assert row.outcome == "failed" and row.wall_seconds is None and row.cpu_seconds is None


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("all", ["succeeded", "failed", "failed", "worker_lost"]),
        ("failures", ["failed", "failed", "worker_lost"]),
        ("off", []),
    ],
)
def test_the_usage_setting_picks_which_attempts_get_a_record(settings, mode, expected):
    """A wave of successes, a failing job's attempts and a reclaimed attempt, under each mode."""
    settings.DISPATCH = {**settings.DISPATCH, "USAGE": mode}
    ok = tasks.add.enqueue(1, 2)
    drain()
    failing = rt.fails.enqueue()
    drain()
    lost = tasks.add.enqueue(3, 4)
    store.jobs_claim(worker_id="doomed-host:1:ab", queues=(), limit=1, lease_seconds=0.01)
    time.sleep(0.05)
    assert store.jobs_rescue_expired(max_worker_lost=3)[0] == [int(lost.id)]
    order = {int(ok.id): 0, int(failing.id): 1, int(lost.id): 2}
    rows = sorted(JobUsage.objects.all(), key=lambda r: (order[r.job_id], r.attempt))
    assert [r.outcome for r in rows] == expected
    assert Job.objects.get(pk=ok.id).state == JobState.SUCCEEDED
    assert Job.objects.get(pk=failing.id).state == JobState.FAILED


def test_a_bad_usage_setting_is_refused_with_the_choices(settings):
    settings.DISPATCH = {**settings.DISPATCH, "USAGE": "some"}
    assert get_settings().validate() == [
        "DISPATCH['USAGE'] must be one of 'all', 'failures', 'off', got 'some'."
    ]
