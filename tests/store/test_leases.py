"""A worker's fenced writes (store/leases.py): a stale lease matches nothing."""

from datetime import timedelta

import pytest
from django.utils import timezone

from django_dispatch import cancel, store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from tests.store.helpers import claim
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_fence_rejects_writes_from_a_stale_lease():
    result = tasks.add.enqueue(1, 1)
    (first,) = claim(worker="w1", lease=0.01)
    # The lease expires; the rescue returns the job to the queue and w2 takes it.
    Job.objects.filter(pk=result.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    requeued, failed = store.jobs_rescue_expired(max_worker_lost=3)
    assert requeued == [int(result.id)] and failed == []
    (second,) = claim(worker="w2")
    assert second.lease.epoch > first.lease.epoch

    # Every write of the old lease now matches nothing.
    assert not store.job_finish_if_leased(first.lease, "stale")
    assert not store.job_fail_if_leased(first.lease, [], None)
    assert not store.job_progress_if_leased(first.lease, 5, lease_seconds=30)
    assert store.jobs_renew_leases([first.lease], lease_seconds=30) == {int(result.id)}
    assert not store.job_release_if_leased(first.lease, attempts=0, worker_ids=[])
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.RUNNING and job.worker_id == "w2" and job.checkpoint is None

    # The current lease still works, exactly once.
    assert store.job_finish_if_leased(second.lease, 2)
    assert not store.job_finish_if_leased(second.lease, 3)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.return_value == 2
    assert job.worker_ids == ["w1", "w2"] and job.worker_lost_count == 1
    assert [e["exception_class_path"] for e in job.errors] == [
        "django_dispatch.exceptions.WorkerLost"
    ]


def test_same_worker_reclaiming_gets_a_new_epoch():
    """The fence must hold even when the job comes back to the same worker id."""
    tasks.add.enqueue(1, 1)
    (first,) = claim(worker="w1")
    assert store.job_fail_if_leased(first.lease, [], retry_in=0)
    (again,) = claim(worker="w1")
    assert again.lease.epoch != first.lease.epoch
    assert not store.job_finish_if_leased(first.lease, "late")


def test_release_gives_the_attempt_back():
    result = tasks.add.enqueue(1, 1)
    (claimed,) = claim()
    assert store.job_release_if_leased(claimed.lease, attempts=0, worker_ids=[])
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.PENDING and job.attempts == 0 and job.worker_ids == []
    assert job.worker_id is None and job.lease_epoch == claimed.lease.epoch + 1


def test_renew_reports_cancelled_jobs_as_lost():
    a, b = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    leases = [c.lease for c in claim()]
    assert store.jobs_renew_leases(leases, lease_seconds=30) == set()
    assert cancel(b.id)
    assert store.jobs_renew_leases(leases, lease_seconds=30) == {int(b.id)}
    assert Job.objects.get(pk=a.id).state == JobState.RUNNING
