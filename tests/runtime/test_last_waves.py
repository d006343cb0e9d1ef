"""A stopping worker writes every success still waiting, not only one wave's worth.

A wave writes at most ``COMPLETION_BATCH`` successes. A stop that reaches its
deadline with more of them waiting (hundreds of async slots finishing at
once) must still write them all: one last wave would leave the rest leased
and unwritten, to run again once their lease ran out.
"""

from __future__ import annotations

import threading

import pytest

from django_dispatch import enqueue_many, store
from django_dispatch.conf import get_settings
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.runtime import metering
from django_dispatch.runtime.completer import COMPLETION_BATCH, BatchCompleter
from django_dispatch.runtime.executor import Outcome
from django_dispatch.runtime.options import WorkerOptions
from django_dispatch.runtime.producer import Producer
from django_dispatch.runtime.running import RunningJob
from django_dispatch.runtime.slots import Slots
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 2 * COMPLETION_BATCH + 50


def test_the_last_waves_write_every_waiting_success():
    enqueue_many(tasks.noop, [((i,), {}) for i in range(JOBS)])
    claimed = store.jobs_claim(worker_id="w-last", queues=(), limit=JOBS, lease_seconds=30)
    assert len(claimed) == JOBS
    slots = Slots(4)
    batch = BatchCompleter(threading.Event(), 30, slots=slots, db="default")
    batch.start()
    producer = Producer(
        WorkerOptions(worker_id="w-last"), get_settings(), db="default", slots=slots, batch=batch
    )
    for job in claimed:
        running = RunningJob(claimed=job, lease_seconds=30)
        slots.running[job.id] = running
        meter = metering.start(job.id, thread_cpu=True)
        meter.stop()
        assert batch.hand_over(running, Outcome("succeeded", job.id), meter)
    producer.flush()
    batch.stop()
    assert not slots.running  # every success written, none holding a slot
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == JOBS
