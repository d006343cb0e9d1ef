"""Rescue, cancel and retry now (store/maintenance.py), and the leader's sweeps."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dispatch import cancel, store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from tests.database_work import database_work
from tests.store.helpers import claim
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_rescue_fails_a_job_that_keeps_killing_workers():
    result = tasks.add.enqueue(1, 1)
    for n in range(3):
        claim(worker=f"w{n}")
        Job.objects.filter(pk=result.id).update(lease_expires_at=timezone.now() - timedelta(1))
        store.jobs_rescue_expired(max_worker_lost=3)
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.FAILED and job.worker_lost_count == 3
    assert len(job.errors) == 3 and job.finished_at is not None
    assert tasks.add.get_result(result.id).status == "FAILED"


def test_rescue_leaves_live_leases_alone():
    tasks.add.enqueue(1, 1)
    claim(lease=60)
    assert store.jobs_rescue_expired(max_worker_lost=3) == ([], [])


def test_cancel_only_live_jobs():
    pending = tasks.add.enqueue(1, 1)
    assert cancel(pending.id) is True
    assert cancel(pending.id) is False  # already cancelled
    assert cancel("12345678") is False and cancel("nope") is False
    assert claim() == []  # a cancelled job is never claimed
    result = tasks.add.get_result(pending.id)
    assert result.status == "FAILED"
    assert result.errors[-1].exception_class_path == "django_dispatch.exceptions.JobCancelled"


def test_retry_now_only_touches_jobs_waiting_for_a_retry():
    later = timezone.now() + timedelta(hours=1)
    deferred = tasks.add.using(run_after=later).enqueue(1, 1)
    retrying = tasks.add.enqueue(2, 2)
    (claimed,) = claim()
    store.job_fail_if_leased(claimed.lease, [], retry_in=3600)
    assert store.jobs_retry_now() == 1
    assert Job.objects.get(pk=deferred.id).run_after == later
    assert [c.id for c in claim()] == [int(retrying.id)]


def test_the_leaders_job_sweeps_read_their_indexes_not_the_finished_jobs():
    """The reclaim of expired leases and the stalled-partition safety net run on the
    leader every interval: their database work is the same beside 20,000 finished
    jobs as beside 200 (counted: ``tests.database_work``). As ``state IN (running,
    cancelled)`` the reclaim matched no partial index and read the whole table, on
    both databases; on SQLite, so did the stalled-partition query."""

    def finished(count: int) -> None:
        Job.objects.bulk_create(
            Job(
                task_path="tests.testapp.tasks.add",
                args=[1, 1],
                state=JobState.CANCELLED if i % 3 == 0 else JobState.SUCCEEDED,
                partition_key=f"k{i}" if i % 2 else None,
                finished_at=timezone.now(),
            )
            for i in range(count)
        )
        if connection.vendor == "postgresql":  # SQLite would keep the statistics for later tests
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE django_dispatch_job")

    def sweeps_work() -> int:
        with database_work() as work:
            assert store.jobs_rescue_expired(max_worker_lost=3) == ([], [])
            assert store.partitions_promote_stalled("default") == 0
        return work.amount

    tasks.add.using(partition_key="k1").enqueue(1, 1)
    claim()  # one running job, its lease far from over
    finished(200)
    few = sweeps_work()
    finished(19_800)
    many = sweeps_work()
    # A read of the whole table costs about 100 times as much with 20,000 rows as with 200.
    assert many <= 10 * max(few, 1), f"{few=} {many=}"
