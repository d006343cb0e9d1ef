"""Micro-benchmark: Task.enqueue() with and without the observability hooks.

    scripts/with-postgres .venv/bin/python benchmarks/enqueue_observability.py [absent|api|sdk]

absent: prometheus-client and opentelemetry blocked (as if not installed);
api: both installed, no OpenTelemetry SDK configured (no-op spans);
sdk: an SDK tracer provider recording every span (in-memory exporter).
Prints the wall time and this process's CPU time per autocommit enqueue
(median of rounds). The CPU time is the steadier number on a busy machine:
it leaves out the wait for the database, which the hooks do not change.
Run from the repository root; it migrates the database it is given.
"""

import os
import statistics
import sys
import time

mode = sys.argv[1] if len(sys.argv) > 1 else "api"
if mode == "absent":
    sys.modules["prometheus_client"] = None
    sys.modules["opentelemetry"] = None
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("DISPATCH_TEST_DB", "postgres")
sys.path.insert(0, os.getcwd())

import django  # noqa: E402

django.setup()
from django.core.management import call_command  # noqa: E402

call_command("migrate", verbosity=0)
if mode == "sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)

from django_dispatch.models import Job  # noqa: E402
from tests.testapp.tasks import add  # noqa: E402

N, ROUNDS = 1000, 7
add.enqueue(0, 0)  # warm up: plans, connection, first imports
times, cpu = [], []
for _ in range(ROUNDS):
    start, start_cpu = time.perf_counter(), time.process_time()
    for i in range(N):
        add.enqueue(i, i)
    cpu.append((time.process_time() - start_cpu) / N)
    times.append((time.perf_counter() - start) / N)
Job.objects.all().delete()
print(
    f"{mode}: wall median {statistics.median(times) * 1e6:.1f} us, "
    f"client CPU median {statistics.median(cpu) * 1e6:.1f} us "
    f"(min {min(cpu) * 1e6:.1f}) per enqueue"
)
