"""On PostgreSQL a wave stays one statement when staging is due: the stager runs
first, in a statement of its own, and the wave's claim takes what it staged.

The one-statement wave (``store.wave``) does not stage itself: staging in its
own statement keeps a busy worker's waves from falling back to the claim's
transaction twice a poll interval.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from django_dispatch.conf import get_settings
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.runtime import flow_cache
from django_dispatch.runtime.completer import BatchCompleter
from django_dispatch.runtime.options import WorkerOptions
from django_dispatch.runtime.producer import Producer
from django_dispatch.runtime.slots import Slots
from tests.conftest import postgres_only
from tests.testapp import tasks

pytestmark = [postgres_only, pytest.mark.django_db(transaction=True)]


def _due_scheduled_job() -> int:
    """A deferred job that came due and was not staged yet."""
    result = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    Job.objects.filter(pk=result.id).update(run_after=timezone.now() - timedelta(minutes=1))
    return int(result.id)


def _producer() -> tuple[Producer, BatchCompleter]:
    slots = Slots(4)
    batch = BatchCompleter(threading.Event(), 30, slots=slots, db="default")
    options = WorkerOptions(worker_id="w-stage")
    return Producer(options, get_settings(), db="default", slots=slots, batch=batch), batch


def test_a_wave_with_staging_due_stages_first_and_stays_one_statement(monkeypatch):
    monkeypatch.setattr(flow_cache, "_staged_at", {})
    monkeypatch.setattr(flow_cache, "_staging_behind", set())
    job_id = _due_scheduled_job()
    producer, batch = _producer()
    claims: list[int] = []
    monkeypatch.setattr(producer, "claim", lambda limit: claims.append(limit) or [])

    assert producer.fused_claim(4) is not None  # one statement, staging notwithstanding
    assert Job.objects.get(pk=job_id).state == JobState.PENDING  # staged, committed
    claimed = batch.write_wave([], producer.claim, 4, producer.fused_claim)
    assert [job.id for job in claimed] == [job_id]
    assert claims == []  # the claim's transaction was never needed
    assert Job.objects.get(pk=job_id).state == JobState.RUNNING


def test_the_stager_before_a_wave_keeps_to_its_throttle(monkeypatch):
    monkeypatch.setattr(flow_cache, "_staged_at", {})
    monkeypatch.setattr(flow_cache, "_staging_behind", set())
    monkeypatch.setattr(flow_cache, "STAGE_BATCH", 1)
    first, second, third = (_due_scheduled_job() for _ in range(3))
    producer, _ = _producer()
    producer.settings = replace(producer.settings, POLL_INTERVAL=3600.0)  # no lapse here

    def states() -> list[str]:
        return [Job.objects.get(pk=i).state for i in (first, second, third)]

    producer.fused_claim(4)
    assert states().count(JobState.PENDING) == 1  # a full batch: behind, stage again
    producer.fused_claim(4)
    assert states().count(JobState.PENDING) == 2
    monkeypatch.setattr(flow_cache, "STAGE_BATCH", 1000)
    producer.fused_claim(4)
    assert states().count(JobState.PENDING) == 3  # caught up: the throttle holds again
    late = _due_scheduled_job()
    producer.fused_claim(4)
    assert Job.objects.get(pk=late).state == JobState.SCHEDULED
