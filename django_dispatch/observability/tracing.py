"""OpenTelemetry spans (optional extra: ``pip install "django-dispatch[otel]"``).

``enqueue`` runs in a *producer* span (``enqueue <task path>``) and stores
the span's context on the job (``Job.trace_context``, the W3C
``traceparent``/``tracestate`` as the configured propagator writes them).
The worker runs each attempt in a *consumer* span (``run <task path>``)
whose parent is that context and which also links to it, so one trace goes
from the web request that enqueued to the job's own database queries (when
the database driver is instrumented), and every attempt of a retried job
hangs under the same producer span.

Attributes follow OpenTelemetry's messaging conventions where they have
one: ``messaging.system = "django_dispatch"``,
``messaging.operation.type`` (``send`` / ``process``),
``messaging.destination.name`` (the queue) and ``messaging.message.id``
(the job id); and ours: ``dispatch.job.id``, ``dispatch.task``,
``dispatch.queue``, ``dispatch.attempt``, ``dispatch.worker.id``.

Without ``opentelemetry-api`` installed ``AVAILABLE`` is False, nothing is
imported, and callers skip this module after one check of that constant.
With the API but no tracer provider set (no SDK), ``active()`` is False and
callers skip it too: no span is made and no context is stored.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from . import installed

if TYPE_CHECKING:
    from ..store import ClaimedJob

#: opentelemetry-api is installed (checked without importing it).
AVAILABLE = installed("opentelemetry")
SYSTEM = "django_dispatch"

_tracer: Any = None
_trace: Any = None  # the opentelemetry.trace module, once imported
_active = False


#: How long a "no tracer provider yet" answer serves: asking OpenTelemetry reads
#: an environment variable and builds its proxy, a few microseconds per job of
#: a worker, for an answer that changes once in a process's life, if ever.
RECHECK_SECONDS = 1.0
_checked_at = float("-inf")


def active() -> bool:
    """Whether the application set a tracer provider (an SDK), so spans are recorded.

    Until it does, OpenTelemetry's API hands out no-op spans: making one
    and injecting its empty context would cost an enqueue tens of
    microseconds for nothing, so callers skip both (call only when
    ``AVAILABLE``). A provider set after import is seen within
    ``RECHECK_SECONDS``; once set, it stays (OpenTelemetry allows setting it once).
    """
    global _trace, _active, _checked_at
    if _active:
        return True
    now = time.monotonic()
    if now - _checked_at < RECHECK_SECONDS:
        return False
    _checked_at = now
    if _trace is None:
        from opentelemetry import trace

        _trace = trace
    provider = _trace.get_tracer_provider()
    _active = not isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider)
    return _active


def tracer() -> Any:
    """Our tracer (a proxy until the application sets a tracer provider)."""
    global _tracer
    if _tracer is None:
        from opentelemetry import trace

        _tracer = trace.get_tracer("django_dispatch")
    return _tracer


class Producer:
    """The producer span of one enqueue and the context to store with the job."""

    __slots__ = ("context", "span")

    def __init__(self, span: Any, context: str | None) -> None:
        self.span = span
        #: JSON text of the propagation headers, None when there is nothing
        #: to propagate (no SDK: a no-op span outside any trace).
        self.context = context

    def enqueued(self, job_id: object) -> None:
        self.span.set_attribute("messaging.message.id", str(job_id))
        self.span.set_attribute("dispatch.job.id", str(job_id))


@contextmanager
def producer(task_path: str, queue: str) -> Iterator[Producer]:
    """Around one enqueue (call only when ``AVAILABLE``)."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": queue,
        "dispatch.task": task_path,
        "dispatch.queue": queue,
    }
    with tracer().start_as_current_span(
        f"enqueue {task_path}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield Producer(span, json.dumps(carrier) if carrier else None)


def stored_context(value: Any) -> dict[str, str] | None:
    """The propagation headers stored on a job (JSON text or already decoded)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


@contextmanager
def consumer(claimed: ClaimedJob) -> Iterator[Any]:
    """Around one attempt, on its job thread (call only when ``AVAILABLE``).

    Yields the span; ``outcome`` records how the attempt ended on it.
    """
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind

    row = claimed.row
    carrier = stored_context(row.get("trace_context"))
    parent = propagate.extract(carrier) if carrier else None
    links = []
    if parent is not None:
        producer_context = trace.get_current_span(parent).get_span_context()
        if producer_context.is_valid:
            links.append(Link(producer_context))
        else:
            parent = None
    queue = row["queue_name"]
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "messaging.destination.name": queue,
        "messaging.message.id": str(claimed.id),
        "dispatch.job.id": str(claimed.id),
        "dispatch.task": row["task_path"],
        "dispatch.queue": queue,
        "dispatch.attempt": row["attempts"],
        "dispatch.worker.id": claimed.lease.worker_id,
    }
    with tracer().start_as_current_span(
        f"run {row['task_path']}",
        context=parent,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def outcome(span: Any, kind: str, exception: BaseException | None) -> None:
    """Record an attempt's outcome on its consumer span."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("dispatch.outcome", kind)
    if exception is not None:
        span.record_exception(exception)
    if kind in ("retry", "failed", "interrupted"):
        span.set_status(Status(StatusCode.ERROR, f"{type(exception).__name__}: {exception}"))
