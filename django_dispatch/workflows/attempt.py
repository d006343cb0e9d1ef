"""One attempt of a step, inside its job: claim the step, run it, record the outcome.

A step's attempts, backoff and parking are decided here and recorded by
``store.workflows``; the job's own retries are not used (every step job has
``max_attempts=1``). The step jobs that an outcome enqueues (the next
steps, a retry, a timer) are built by the ``build_job`` passed in: the
task they run (``tasks.run_step``) calls this module, so this module takes
its builder as an argument rather than importing it back.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from ..store import workflows as wf_store
from .atomic import atomic_body
from .backoff import backoff_delay, default_backoff
from .context import StartChild, StartMap, StepContext
from .exceptions import UnknownWorkflow, WorkflowDefinitionError
from .registry import get_workflow, resolve_step
from .runner import StepOutcome, error_of, run_attempt

if TYPE_CHECKING:
    from ..tasks.context import DispatchTaskContext
    from .definition import Workflow

logger = logging.getLogger("django_dispatch.workflows")


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
            queue_name=s.queue_name,
            priority=s.priority,
        )
        for s in workflow.steps
    ]
    return wf_store.RunSpec(
        workflow.name, input, steps, workflow.queue_name, idempotency_key, call_context=context
    )


def execute_step(
    job_context: DispatchTaskContext,
    step_id: int,
    generation: int,
    *,
    build_job: wf_store.StepJobBuilder,
) -> dict[str, Any]:
    """Claim the step, run one attempt, record its outcome. Returns a summary for the job.

    A job that cannot claim its step (reset, skipped, cancelled, already
    done) does nothing and succeeds: it was superseded.
    """
    job_id = int(job_context.task_result.id)
    claimed = wf_store.workflow_step_claim(
        step_id, generation, job_id, epoch=job_context.lease.epoch
    )
    if claimed is None:
        # A wait's timer job made due before its time: the wait keeps its end.
        wf_store.rearm_timer(step_id, job_id, build_job=build_job)
        return {"step": step_id, "outcome": "superseded"}
    summary = {"run": claimed.run_id, "step": claimed.name, "attempt": claimed.attempt}
    outcome = attempt(job_context, claimed, build_job)
    recorded = outcome.recorded
    if recorded is None and outcome.kind == "succeeded":
        # A map child's success may go with its job's, in the worker's wave.
        recorded = (
            wf_store.workflow_step_succeed_with_job(
                claimed,
                outcome.value,
                job_id,
                job_context.lease.epoch,
                build_job=build_job,
                fallback=partial(record, claimed, outcome, build_job=build_job),
            )
            or None
        )
    if recorded is None:  # else written with the atomic step's own writes, or rolled back
        recorded = record(claimed, outcome, build_job=build_job)
    return {**summary, "outcome": outcome.kind if recorded else "discarded"}


def attempt(
    job_context: DispatchTaskContext,
    claimed: wf_store.ClaimedStep,
    build_job: wf_store.StepJobBuilder,
) -> StepOutcome:
    """One attempt of a claimed step: its outcome, written only by an atomic step."""
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
        return StepOutcome(kind="failed", exception=e, retryable=False, counted=False)
    func = step.func
    if step.atomic:
        ctx.atomic = True
        func = atomic_body(
            func, claimed.timeout, lambda out: record(claimed, out, build_job=build_job)
        )
    return run_attempt(func, ctx, claimed.timeout)


def record(
    claimed: wf_store.ClaimedStep, outcome: StepOutcome, *, build_job: wf_store.StepJobBuilder
) -> bool:
    """Persist one attempt's outcome, fenced by its claim. False: the claim was void."""
    step_id, claim_id = claimed.step_id, claimed.claim_id
    if outcome.kind == "succeeded":
        won = wf_store.workflow_step_succeed(
            step_id,
            claim_id,
            outcome.value,
            build_job=build_job,
            run_id=claimed.run_id,
            map_child=claimed.map_child,
        )
    elif outcome.kind == "child":
        won = _start_child(claimed, outcome.value, build_job)
    elif outcome.kind == "map":
        won = _start_map(claimed, outcome.value, build_job)
    elif outcome.kind == "wait":
        won = wf_store.workflow_step_wait(step_id, claim_id, outcome.value, build_job=build_job)
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
            build_job=build_job,
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


def _start_child(
    claimed: wf_store.ClaimedStep, request: StartChild, build_job: wf_store.StepJobBuilder
) -> bool:
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
            build_job=build_job,
        )
    child_id = wf_store.workflow_step_wait_child(
        claimed.step_id, claimed.claim_id, child, build_job=build_job
    )
    return child_id is not None


def _start_map(
    claimed: wf_store.ClaimedStep, request: StartMap, build_job: wf_store.StepJobBuilder
) -> bool:
    """The step waits for one child run per input (none: it succeeds with ``[]``)."""
    try:
        template = run_spec(get_workflow(request.workflow_name), None, context=claimed.call_context)
    except (UnknownWorkflow, WorkflowDefinitionError) as e:
        return wf_store.workflow_step_fail(
            claimed.step_id,
            claimed.claim_id,
            error_of(e, claimed.attempt),
            None,
            build_job=build_job,
        )
    return wf_store.workflow_step_map(
        claimed.step_id,
        claimed.claim_id,
        template,
        request.inputs,
        request.max_parallel,
        build_job=build_job,
    )
