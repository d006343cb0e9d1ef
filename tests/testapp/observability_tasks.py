"""Tasks for the observability tests (logs, metrics, traces)."""

import time
from pathlib import Path

from django_dispatch.compat import task

from .models import SideEffect


@task()
def wait_for_path(key, path, max_seconds=30):
    """Runs until ``path`` exists (a job the test stops from outside)."""
    SideEffect.objects.create(key=key, note="start")
    deadline = time.monotonic() + max_seconds
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return key


@task()
def enqueue_child(value):
    """Enqueues one job from inside a job (counted by the worker's own metrics)."""
    from .tasks import noop

    noop.enqueue(value)
    return value


@task()
def query_something(key):
    """Runs one query of its own in a span of its own (as an instrumented driver would)."""
    from opentelemetry import trace

    with trace.get_tracer("tests").start_as_current_span("INSERT sideeffect"):
        SideEffect.objects.create(key=key, note="queried")
    return key
