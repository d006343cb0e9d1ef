"""OpenTelemetry: from the request that enqueues to the job's own work, one trace.

The SDK's in-memory exporter records every span of this process; the jobs
run in-process (``drain``), through the real claim and job threads.
"""

from __future__ import annotations

import json

import pytest

from django_dispatch.models import Job
from django_dispatch.observability import tracing
from django_dispatch.testing import drain
from tests.testapp import observability_tasks, tasks

pytest.importorskip("opentelemetry.sdk")
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

pytestmark = pytest.mark.django_db(transaction=True)

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider():
    """One SDK provider per process (OpenTelemetry allows setting it once)."""
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        current = TracerProvider()
        trace.set_tracer_provider(current)
    current.add_span_processor(SimpleSpanProcessor(EXPORTER))
    tracing._checked_at = float("-inf")  # an earlier test's "no provider" no longer stands
    return current


@pytest.fixture
def spans():
    EXPORTER.clear()
    return EXPORTER


def test_one_enqueue_in_a_request_yields_a_linked_consumer_span(spans):
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("GET /signup", kind=SpanKind.SERVER) as request:
        result = observability_tasks.query_something.enqueue("traced")
    drain()
    finished = spans.get_finished_spans()
    [producer] = [s for s in finished if s.kind == SpanKind.PRODUCER]
    [consumer] = [s for s in finished if s.kind == SpanKind.CONSUMER]
    [own] = [s for s in finished if s.name == "INSERT sideeffect"]
    trace_id = request.get_span_context().trace_id

    # The enqueue: a producer span in the request's trace, its context on the job.
    assert producer.name == "enqueue tests.testapp.observability_tasks.query_something"
    assert producer.parent.span_id == request.get_span_context().span_id
    assert producer.attributes["messaging.system"] == "django_dispatch"
    assert producer.attributes["messaging.message.id"] == result.id
    assert producer.attributes["dispatch.task"] == (
        "tests.testapp.observability_tasks.query_something"
    )
    stored = Job.objects.get(pk=result.id).trace_context
    assert f"{trace_id:032x}-{producer.context.span_id:016x}" in stored["traceparent"]

    # The attempt: a consumer span under the producer, and linked to it.
    assert consumer.context.trace_id == trace_id
    assert consumer.parent.span_id == producer.context.span_id
    assert [link.context.span_id for link in consumer.links] == [producer.context.span_id]
    assert consumer.attributes["messaging.system"] == "django_dispatch"
    assert consumer.attributes["dispatch.job.id"] == result.id
    assert consumer.attributes["dispatch.task"] == (
        "tests.testapp.observability_tasks.query_something"
    )
    assert consumer.attributes["dispatch.queue"] == "default"
    assert consumer.attributes["dispatch.attempt"] == 1
    assert consumer.attributes["dispatch.worker.id"] == "test-worker"
    assert consumer.attributes["dispatch.outcome"] == "succeeded"
    assert consumer.status.status_code != StatusCode.ERROR

    # The job's own work runs inside the attempt's span.
    assert own.context.trace_id == trace_id
    assert own.parent.span_id == consumer.context.span_id


def test_every_attempt_of_a_retried_job_hangs_under_its_enqueue(spans):
    result = tasks.fail_twice.enqueue("traced-retry")
    drain()
    finished = spans.get_finished_spans()
    [producer] = [s for s in finished if s.kind == SpanKind.PRODUCER]
    consumers = sorted(
        (s for s in finished if s.kind == SpanKind.CONSUMER),
        key=lambda s: s.attributes["dispatch.attempt"],
    )
    assert [s.attributes["dispatch.attempt"] for s in consumers] == [1, 2, 3]
    assert {s.parent.span_id for s in consumers} == {producer.context.span_id}
    assert [s.attributes["dispatch.outcome"] for s in consumers] == ["retry", "retry", "succeeded"]
    assert [s.status.status_code for s in consumers][:2] == [StatusCode.ERROR] * 2
    assert all(s.attributes["dispatch.job.id"] == result.id for s in consumers)
    assert consumers[0].events[0].name == "exception"


def test_a_job_enqueued_with_no_trace_context_still_gets_a_span(spans):
    """Rows written by the scheduler or by code without OpenTelemetry: a root span."""
    [job] = Job.objects.bulk_create([Job(task_path="tests.testapp.tasks.add", args=[1, 2])])
    drain()
    [consumer] = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert consumer.parent is None and consumer.links == ()
    assert consumer.attributes["dispatch.job.id"] == str(job.pk)
    assert Job.objects.get(pk=job.pk).trace_context is None


def test_a_broken_stored_context_is_ignored(spans):
    [job] = Job.objects.bulk_create(
        [Job(task_path="tests.testapp.tasks.add", args=[1, 2], trace_context={"traceparent": "x"})]
    )
    drain()
    [consumer] = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert consumer.parent is None
    assert tasks.add.get_result(str(job.pk)).return_value == 3
    assert json.dumps(Job.objects.get(pk=job.pk).trace_context) == '{"traceparent": "x"}'
