"""The workflow engine's entry points: start a run, sweep lost steps, build step jobs.

Steps execute as jobs of ``django_dispatch.workflows.tasks.run_step``, so
claims, leases, heartbeats, reclaim after SIGKILL, graceful shutdown and
LISTEN wake-ups are the job layer's; one attempt inside its job is
``attempt.execute_step``. This module binds the store's workflow
transitions to the step jobs of ``run_step`` (``build_step_job``), for the
callers above it: ``Workflow.start``, the operator commands, maintenance.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..models import WorkflowRun
from ..models.job import KEY_MAX_LENGTH
from ..store import using_backend
from ..store import workflows as wf_store
from ..tasks.registry import namespace_for
from ..tasks.values import to_json
from .attempt import execute_step, record, run_spec
from .tasks import build_step_job

if TYPE_CHECKING:
    from .definition import Workflow

__all__ = [
    "build_step_job",
    "execute_step",
    "record",
    "run_spec",
    "start_run",
]


def start_run(
    workflow: Workflow,
    input: Any,
    *,
    idempotency_key: str | None = None,
    backend: str = "default",
    context: Any = None,
) -> WorkflowRun:
    """See ``Workflow.start``."""
    namespace = namespace_for(backend)  # an unknown alias: ValueError, nothing written
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str)
        or not idempotency_key
        or len(idempotency_key) > KEY_MAX_LENGTH
    ):
        raise ValueError(
            f"idempotency_key must be a non-empty string of at most {KEY_MAX_LENGTH} "
            f"characters, got {idempotency_key!r}."
        )
    spec = run_spec(
        workflow,
        to_json(input, "A workflow run's input"),
        idempotency_key=idempotency_key,
        context=to_json(context, "A workflow run's call context"),
    )
    spec = dataclasses.replace(spec, namespace=namespace)
    with using_backend(backend):  # the run, its steps and their jobs: the alias's database
        run, _created = wf_store.workflow_run_insert(spec, build_job=build_step_job)
    return run
