"""A scheduled job that came due is waiting even before a worker stages it, and a
burst of due jobs is staged as fast as the claims take them.

Staging runs in the workers' claims: with every worker of a namespace down,
a deferred job or a retry stays ``scheduled`` however overdue. The outage
signals (``dispatch_status``, the console, the gauges) must still see it.
"""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.observability import metrics
from django_dispatch.queries import console
from django_dispatch.runtime import flow_cache
from tests.store.helpers import claim_as_worker
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

OVERDUE = timedelta(minutes=10)


def _overdue_scheduled_job() -> Job:
    """A deferred job due ten minutes ago that no worker staged (none runs)."""
    result = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    Job.objects.filter(pk=result.id).update(run_after=timezone.now() - OVERDUE)
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.SCHEDULED
    return job


def test_an_overdue_scheduled_job_is_due_in_dispatch_status():
    job = _overdue_scheduled_job()
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(2, 2)  # not due
    out = io.StringIO()
    call_command("dispatch_status", "--json", stdout=out)
    (queue,) = [q for q in json.loads(out.getvalue())["queues"] if q["name"] == job.queue_name]
    assert queue["scheduled"] == 2 and queue["pending"] == 0
    assert queue["oldest_waiting_seconds"] >= OVERDUE.total_seconds() - 5


def test_an_overdue_scheduled_job_is_waiting_and_unserved_on_the_console():
    job = _overdue_scheduled_job()
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(2, 2)  # not due
    (queue,) = [q for q in console.overview().queues if q.name == job.queue_name]
    assert (queue.waiting, queue.deferred, queue.scheduled) == (1, 1, 2)
    assert queue.unserved
    assert queue.oldest_waiting is not None
    assert queue.oldest_waiting <= timezone.now() - OVERDUE + timedelta(seconds=5)


def test_an_overdue_scheduled_job_ages_the_oldest_waiting_gauge():
    job = _overdue_scheduled_job()
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(2, 2)  # not due
    snapshot = metrics.cluster_snapshot(max_age=1, live_within=30)
    assert snapshot.due[job.queue_name] == 1
    assert snapshot.oldest_waiting[job.queue_name] >= OVERDUE.total_seconds() - 5


def test_a_full_staging_pass_stages_again_at_the_next_claim(monkeypatch):
    """The throttle (once per half poll interval) holds only while the stager keeps
    up: after a full batch, the next claim stages again at once."""
    monkeypatch.setattr(flow_cache, "STAGE_BATCH", 3)
    monkeypatch.setattr(flow_cache, "_staged_at", {})
    monkeypatch.setattr(flow_cache, "_staging_behind", set())
    later = timezone.now() + timedelta(hours=1)
    ids = [int(tasks.add.using(run_after=later).enqueue(i, i).id) for i in range(7)]
    Job.objects.filter(pk__in=ids).update(run_after=timezone.now() - OVERDUE)

    def scheduled() -> int:
        return Job.objects.filter(state=JobState.SCHEDULED).count()

    hour = 3600.0  # the throttle never lapses within this test
    assert len(claim_as_worker(limit=1, poll_interval=hour)) == 1
    assert scheduled() == 4  # a full batch: the stager is behind
    assert len(claim_as_worker(limit=1, poll_interval=hour)) == 1
    assert scheduled() == 1  # full again
    assert len(claim_as_worker(limit=1, poll_interval=hour)) == 1
    assert scheduled() == 0  # one: caught up
    # Caught up, the throttle holds again: a job due now waits for it.
    late = tasks.add.using(run_after=later).enqueue(9, 9)
    Job.objects.filter(pk=late.id).update(run_after=timezone.now() - OVERDUE)
    claim_as_worker(limit=1, poll_interval=hour)
    assert scheduled() == 1
