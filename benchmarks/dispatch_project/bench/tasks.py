"""The benchmark's two tasks, identical for every Django backend."""

import os
import time

from django.tasks import task


@task
def noop() -> None:
    """Does nothing: the drain measures the queue, not the work."""


@task
def record_start(seq: int) -> None:
    """Append ``seq`` and the wall-clock start time to ``$BENCH_LATENCY_FILE``."""
    started = time.time()
    with open(os.environ["BENCH_LATENCY_FILE"], "a") as f:
        f.write(f"{seq} {started:.6f}\n")
