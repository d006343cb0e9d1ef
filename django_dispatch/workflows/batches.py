"""A ``ctx.map`` batch's job: its children's attempts, one after the other.

The batch's steps are claimed together when its job starts
(``store.workflows.mapbatch``), so a claim can grow old while the children
before it run. As a step job's claim kept by its worker's wave is read again
past ``preclaim.FRESH_SECONDS``, the batch reads its remaining claims again
once ``CHECK_SECONDS`` have passed since it last did: a child cancelled,
skipped or reopened meanwhile does not run its body. At the same moments it
writes the successes it holds, so a lost worker's successor re-runs at most
that much of what already succeeded. A job cancelled, or whose lease was lost,
starts no further child and puts the ones it had not started back to
``ready``, unspent.
"""

from __future__ import annotations

import time
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING, Any

from ..store import workflows as wf_store
from ..store.workflows.preclaim import FRESH_SECONDS
from .attempt import attempt, record

if TYPE_CHECKING:
    from ..tasks.context import DispatchTaskContext

#: Seconds between a batch's reads of its claims (and writes of its successes).
CHECK_SECONDS = FRESH_SECONDS


def execute_steps(
    job_context: DispatchTaskContext,
    pairs: list[list[int]],
    *,
    build_job: wf_store.StepJobBuilder,
) -> dict[str, Any]:
    """Claim a batch's steps, run one attempt of each in turn, write the
    successes together and any other outcome as its own job would. Returns
    how many steps came to each outcome."""
    job_id = int(job_context.task_result.id)
    claims = wf_store.workflow_steps_claim([(int(s), int(g)) for s, g in pairs], job_id)
    todo = [c for c in claims if c is not None]
    counts: Counter[str] = Counter(superseded=len(claims) - len(todo))
    successes: list[tuple[wf_store.ClaimedStep, Any, Any]] = []
    held = {c.step_id for c in todo}
    checked = time.monotonic()
    try:
        for i, claimed in enumerate(todo):
            if job_context.cancel_event.is_set():
                counts["left"] += wf_store.workflow_steps_release(todo[i:])
                break
            if time.monotonic() - checked > CHECK_SECONDS:
                _write(successes, counts, build_job)
                held = wf_store.workflow_steps_held(todo[i:])
                checked = time.monotonic()
            if claimed.step_id not in held:
                counts["superseded"] += 1
                continue
            outcome = attempt(job_context, claimed, build_job)
            recorded = outcome.recorded
            if recorded is None and outcome.kind == "succeeded":
                fallback = partial(record, claimed, outcome, build_job=build_job)
                successes.append((claimed, outcome.value, fallback))
                continue
            if recorded is None:
                recorded = record(claimed, outcome, build_job=build_job)
            counts[outcome.kind if recorded else "discarded"] += 1
    finally:
        _write(successes, counts, build_job)
    return {"steps": len(pairs), **{k: n for k, n in counts.items() if n}}


def _write(
    successes: list[tuple[wf_store.ClaimedStep, Any, Any]],
    counts: Counter[str],
    build_job: wf_store.StepJobBuilder,
) -> None:
    for won in wf_store.workflow_steps_succeed(successes, build_job=build_job):
        counts["succeeded" if won else "discarded"] += 1
    successes.clear()
