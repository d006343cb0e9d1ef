"""How far behind the workers are, per namespace: for autoscalers and alerts."""

from __future__ import annotations

from django.db.models import Min

from ..core.workflow_states import StepState
from ..models import WorkflowTask
from ..store import database_for, db_now
from ..tasks.registry import namespace_for

__all__ = ["oldest_runnable_age"]


def oldest_runnable_age(*, backend: str = "default") -> float:
    """Seconds the oldest runnable workflow step of ``backend``'s namespace has
    waited for a worker (0.0: none waits).

    A step is runnable once it is ready and its backoff has passed. Feed this
    to an autoscaler: it grows when the workers of that namespace fall behind
    (another namespace's backlog is another set of workers' business).
    Database clock; one probe of the partial index of ready steps, which
    leads with the namespace.
    """
    namespace = namespace_for(backend)
    db = database_for(backend)  # the alias's database, as its namespace
    now = db_now(db)
    oldest = (
        WorkflowTask.objects.using(db)
        .filter(namespace=namespace, state=StepState.READY, ready_at__lte=now)
        .aggregate(oldest=Min("ready_at"))["oldest"]
    )
    return 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
