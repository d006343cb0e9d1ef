"""Tasks of the flow-control tests (tests/test_flow*.py): each run records its
start (and end) in a real table, so tests count what started when."""

import os
import time

from django.utils import timezone

from django_dispatch import task

from .models import SideEffect


@task()
def mark(key, seconds=0.0, note="run"):
    """Record the start, sleep ``seconds``, record the end (one row, updated)."""
    row = SideEffect.objects.create(
        key=key, note=note, worker_pid=os.getpid(), started_at=timezone.now()
    )
    if seconds:
        time.sleep(seconds)
    SideEffect.objects.filter(pk=row.pk).update(finished_at=timezone.now())
    return key


@task(concurrency_limit=3)
def capped(key, seconds=0.0):
    """At most 3 at once per concurrency key: records its window (start, end)."""
    row = SideEffect.objects.create(
        key=key, note="capped", worker_pid=os.getpid(), started_at=timezone.now()
    )
    if seconds:
        time.sleep(seconds)
    SideEffect.objects.filter(pk=row.pk).update(finished_at=timezone.now())
    return key


@task(concurrency_limit=2)
def capped_two(key):
    return key


@task(rate_limit="20/s")
def rated(key):
    """At most 20 starts per second (a fixed window)."""
    return key


@task(rate_limit="3/2s")
def rated_slowly(key):
    return key


@task(max_attempts=2, partition_retry="yield")
def flaky_yielding(key):
    return key


@task(max_attempts=2)
def flaky_holding(key):
    return key


@task()
def mark_too(key, seconds=0.0):
    """``mark`` under another task path: queue-level limits span tasks."""
    return mark.func(key, seconds, note="too")
