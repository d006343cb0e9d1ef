"""Tasks of the resources and usage tests (#16). Side effects go to real tables."""

import os
import time

from django.utils import timezone

from django_dispatch import task

from .models import SideEffect


def no_wait(exception, task_result):
    return 0


@task()
def burn(seconds):
    """CPU-bound for ``seconds``: its thread's CPU time is about its wall time."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


@task(max_attempts=2, backoff=no_wait)
def fails(message="no"):
    raise ValueError(message)


@task(timeout=0.3, max_attempts=1)
def overruns(seconds=2.0):
    time.sleep(seconds)


@task()
def holds_memory(mb):
    """Allocates ``mb`` MiB and touches every page, so the process's peak RSS sees it."""
    block = bytearray(mb * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return len(block)


@task()
def window(key, seconds):
    """One row per run with its window, to find overlaps afterwards."""
    row = SideEffect.objects.create(
        key=key, worker_pid=os.getpid(), note="window", started_at=timezone.now()
    )
    time.sleep(seconds)
    row.finished_at = timezone.now()
    row.save(update_fields=["finished_at"])
    return key


@task(resources={"memory_mb": 600})
def big(key, seconds=0.2):
    return window.func(key, seconds)


@task(resources={"gpu": 1})
def on_gpu(key):
    return window.func(key, 0.01)


@task(resources="auto")
def estimated(mb):
    return holds_memory.func(mb)


@task(resources={"memory_mb": 600}, timeout=0.2, max_attempts=1)
def hog(key, seconds):
    """Overruns its timeout and ignores the request to stop."""
    return window.func(key, seconds)
