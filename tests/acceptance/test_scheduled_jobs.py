"""Deferred jobs and retries backing off wait as ``scheduled`` and a real
``rundispatch`` runs them once due: within one poll interval, as before they
left the claim index."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_dispatch.models import Job
from django_dispatch.states import JobState
from tests.conftest import wait_until
from tests.testapp import tasks

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

POLL = 0.3


def _job(job_id) -> Job:
    return Job.objects.get(pk=job_id)


def test_deferred_jobs_and_retries_are_scheduled_and_run_when_due(start_worker):
    deferred = tasks.add.using(run_after=timezone.now() + timedelta(seconds=2)).enqueue(1, 2)
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 3)
    retried = tasks.fail_twice.enqueue("scheduled-retry")
    assert _job(deferred.id).state == JobState.SCHEDULED
    worker = start_worker("--concurrency", "2", overrides={"POLL_INTERVAL": POLL})
    # The first failure's backoff (at least half a second): scheduled meanwhile.
    wait_until(
        lambda: _job(retried.id).attempts >= 1 and _job(retried.id).state == JobState.SCHEDULED,
        what="the failed attempt's retry scheduled",
    )
    wait_until(
        lambda: _job(deferred.id).state == JobState.SUCCEEDED,
        timeout=30,
        what="the deferred job run: " + worker.output(),
    )
    job = _job(deferred.id)
    # Not before its time on the database clock; within a poll interval of it
    # (and a second of slack for a busy machine).
    assert job.started_at >= job.run_after
    assert (job.started_at - job.run_after).total_seconds() < POLL + 1.0, worker.output()
    wait_until(
        lambda: _job(retried.id).state == JobState.SUCCEEDED,
        timeout=30,
        what="the retried job's third attempt: " + worker.output(),
    )
    assert len(_job(retried.id).errors) == 2
    assert _job(later.id).state == JobState.SCHEDULED  # not due: left alone
