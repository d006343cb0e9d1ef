"""The workflow engine: start runs, and run one step attempt inside its job.

Steps execute as jobs of ``django_dispatch.workflows.tasks.run_step``, so
claims, leases, heartbeats, reclaim after SIGKILL, graceful shutdown and
LISTEN wake-ups are the job layer's. The job's own retries are not used
(every step job has ``max_attempts=1``): a step's attempts, backoff and
parking are decided here and recorded by ``store.workflows``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from ..encoding import to_json
from ..enqueue import DispatchBackendBase, namespace_for
from ..models import Job, WorkflowRun
from ..models.job import KEY_MAX_LENGTH
from ..store import workflows as wf_store
from .context import StartChild, StepContext
from .definition import Workflow, backoff_delay, default_backoff, get_workflow, resolve_step
from .exceptions import UnknownWorkflow, WorkflowDefinitionError
from .runner import StepOutcome, error_of, run_attempt

if TYPE_CHECKING:
    from ..context import DispatchTaskContext

logger = logging.getLogger("django_dispatch.workflows")


def build_step_job(step_id: int, generation: int, queue_name: str) -> Job:
    """An unsaved job of ``run_step`` for one step, with no job-level retries."""
    from .tasks import run_step

    task = run_step if queue_name == run_step.queue_name else run_step.using(queue_name=queue_name)
    backend = task.get_backend()
    if not isinstance(backend, DispatchBackendBase):
        raise ImproperlyConfigured(
            "workflows need TASKS['default'] to use django_dispatch.backend.DispatchBackend."
        )
    job = backend.build_job(task, [step_id, generation], {})
    job.max_attempts = 1  # step attempts are the engine's, not the job's
    return job


def run_spec(
    workflow: Workflow, input: Any, *, idempotency_key: str | None = None, context: Any = None
) -> wf_store.RunSpec:
    """A run of ``workflow`` to insert, with the snapshot of its steps as defined now."""
    if not workflow.steps:
        raise WorkflowDefinitionError(f"workflow {workflow.name!r} has no steps to run.")
    steps = [
        wf_store.StepSpec(
            name=s.name,
            handler_path=s.handler_path,
            sequence=s.sequence,
            depends_on=s.depends_on,
            max_attempts=s.max_attempts,
            backoff=s.backoff,
            timeout=s.timeout,
        )
        for s in workflow.steps
    ]
    return wf_store.RunSpec(
        workflow.name, input, steps, workflow.queue_name, idempotency_key, call_context=context
    )


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
    run, _created = wf_store.workflow_run_insert(spec, build_job=build_step_job)
    return run


def execute_step(job_context: DispatchTaskContext, step_id: int, generation: int) -> dict[str, Any]:
    """Claim the step, run one attempt, record its outcome. Returns a summary for the job.

    A job that cannot claim its step (reset, skipped, cancelled, already
    done) does nothing and succeeds: it was superseded.
    """
    job_id = int(job_context.task_result.id)
    claimed = wf_store.workflow_step_claim(step_id, generation, job_id)
    if claimed is None:
        # A wait's timer job made due before its time: the wait keeps its end.
        wf_store.rearm_timer(step_id, job_id, build_job=build_step_job)
        return {"step": step_id, "outcome": "superseded"}
    summary = {"run": claimed.run_id, "step": claimed.name, "attempt": claimed.attempt}
    ctx = StepContext(
        run_id=claimed.run_id,
        step=claimed.name,
        input=claimed.input,
        outputs=claimed.outputs,
        attempt=claimed.attempt,
        generation=claimed.generation,
        step_id=claimed.step_id,
        claim_id=claimed.claim_id,
        saved_checkpoint=claimed.checkpoint,
        job_cancel_event=job_context.cancel_event,
        call_context=claimed.call_context,
        waits=claimed.waits,
    )
    try:
        step = resolve_step(claimed.workflow_name, claimed.name, claimed.handler_path)
    except UnknownWorkflow as e:
        outcome = StepOutcome(kind="failed", exception=e, retryable=False, counted=False)
    else:
        outcome = run_attempt(step.func, ctx, claimed.timeout)
    recorded = record(claimed, outcome)
    return {**summary, "outcome": outcome.kind if recorded else "discarded"}


def record(claimed: wf_store.ClaimedStep, outcome: StepOutcome) -> bool:
    """Persist one attempt's outcome, fenced by its claim. False: the claim was void."""
    step_id, claim_id = claimed.step_id, claimed.claim_id
    if outcome.kind == "succeeded":
        won = wf_store.workflow_step_succeed(
            step_id, claim_id, outcome.value, build_job=build_step_job
        )
    elif outcome.kind == "child":
        won = _start_child(claimed, outcome.value)
    elif outcome.kind == "wait":
        won = wf_store.workflow_step_wait(
            step_id, claim_id, outcome.value, build_job=build_step_job
        )
    elif outcome.kind == "failed" and not outcome.counted:
        assert outcome.exception is not None
        won = wf_store.workflow_step_park(
            step_id, claim_id, error_of(outcome.exception, claimed.attempt)
        )
    elif outcome.kind == "failed":
        assert outcome.exception is not None
        won = wf_store.workflow_step_fail(
            step_id,
            claim_id,
            error_of(outcome.exception, claimed.attempt),
            _retry_in(claimed, outcome),
            build_job=build_step_job,
        )
    else:
        logger.info(
            "step %s of run %s: attempt stopped; result discarded", claimed.name, claimed.run_id
        )
        return False
    if not won:
        logger.warning(
            "step %s of run %s: claim lost before its %s outcome was recorded (run cancelled "
            "or reopened, step skipped or swept); discarded",
            claimed.name,
            claimed.run_id,
            outcome.kind,
        )
    return won


def _retry_in(claimed: wf_store.ClaimedStep, outcome: StepOutcome) -> float | None:
    """Seconds before the next attempt, or None when the step is out of attempts."""
    failures = claimed.failures + 1
    if not outcome.retryable or failures >= claimed.max_attempts:
        return None
    try:
        return backoff_delay(claimed.backoff, failures)
    except Exception:
        logger.exception("step %s: backoff function failed; using the default", claimed.name)
        return default_backoff(failures)


def _start_child(claimed: wf_store.ClaimedStep, request: StartChild) -> bool:
    try:
        child = run_spec(
            get_workflow(request.workflow_name), request.input, context=claimed.call_context
        )
    except (UnknownWorkflow, WorkflowDefinitionError) as e:
        return wf_store.workflow_step_fail(
            claimed.step_id,
            claimed.claim_id,
            error_of(e, claimed.attempt),
            None,
            build_job=build_step_job,
        )
    child_id = wf_store.workflow_step_wait_child(
        claimed.step_id, claimed.claim_id, child, build_job=build_step_job
    )
    return child_id is not None


def sweep_stale_steps(older_than_seconds: float, namespace: str = "") -> list[int]:
    """``store.workflows.sweep_stale_steps`` with the engine's step jobs (for maintenance)."""
    return wf_store.sweep_stale_steps(
        older_than_seconds, build_job=build_step_job, namespace=namespace
    )
