"""The benchmark's tasks, identical for every Django backend."""

import asyncio
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


@task
def realistic(seq: int) -> None:
    """What a typical job does to the site's database: create a row, then update it."""
    from bench.orders import place_order

    place_order(seq)


@task
async def async_sleep() -> None:
    """An I/O-bound job: awaits ``$BENCH_SLEEP_MS`` ms (an HTTP call, an email) and returns."""
    await asyncio.sleep(float(os.environ.get("BENCH_SLEEP_MS", "50")) / 1000)
