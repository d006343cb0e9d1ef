"""``@workflow.step(atomic=True)``: the step's writes commit with its outcome, or not at all.

In-process tests drive the worker's path with ``drain_workflows``; each
step's writes are SideEffect rows with no unique key, so a count of rows
is a count of executions that committed. The proof under faults (SIGKILLs,
a frozen worker, a PostgreSQL crash) is tests/chaos/test_chaos_atomic.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from django_dispatch import events
from django_dispatch.compat import InvalidTask
from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import Artifact, WorkflowRun, WorkflowTask
from django_dispatch.workflows import Workflow, WorkflowDefinitionError
from django_dispatch.workflows.testing import drain_workflows
from tests.conftest import wait_until
from tests.testapp import atomic_workflows as aw
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def notes(key: str) -> list[str]:
    return sorted(SideEffect.objects.filter(key=key).values_list("note", flat=True))


def step(run: WorkflowRun, name: str) -> WorkflowTask:
    return WorkflowTask.objects.get(run=run, name=name)


async def fetch(ctx):
    """Not a step: decorated by the test below."""


def plain(ctx):
    """Not a step: decorated by the test below."""


def test_an_async_atomic_step_is_refused_at_definition():
    wf = Workflow("tests.atomic_refused")
    with pytest.raises(WorkflowDefinitionError, match=r"async def with atomic=True.*Make it a def"):
        wf.step(atomic=True)(fetch)
    with pytest.raises(WorkflowDefinitionError, match="atomic must be True or False, got 'yes'"):
        wf.step(atomic="yes")(plain)  # type: ignore[arg-type]
    assert wf.steps == ()  # nothing registered by a refused definition
    assert aw.pay.get_step("charge").atomic and not aw.pay.get_step("receipt").atomic


def test_an_atomic_step_that_raises_keeps_none_of_its_writes_and_parks_the_run():
    run = aw.pay.start({"key": "doomed"})
    drain_workflows()
    run.refresh_from_db()
    charge = step(run, "charge")
    assert (run.state, charge.state, charge.failures) == (RunState.STUCK, StepState.FAILED, 3)
    assert notes("doomed") == []  # three attempts wrote a row each: all rolled back
    assert [e["exception_class_path"] for e in charge.errors] == ["builtins.RuntimeError"] * 3


def test_a_retry_that_succeeds_keeps_only_its_own_writes_and_the_run_goes_on():
    run = aw.pay.start({"key": "second-time", "succeed_on": 2})
    drain_workflows()
    run.refresh_from_db()
    assert (run.state, run.output) == (RunState.SUCCEEDED, {"charged": 2})
    assert step(run, "charge").output == {"charged": 2}
    assert notes("second-time") == ["attempt-2", "receipt"]


def test_a_claim_lost_mid_body_rolls_the_writes_back_and_records_nothing():
    run = aw.lost.start({"key": "lost"})
    drain_workflows()
    row = step(run, "loses_its_claim")
    # The step still belongs to the attempt that took it over: no output, no rows.
    assert (row.state, row.claim_id, row.output) == (StepState.RUNNING, "the-next-attempt", None)
    assert notes("lost") == []
    run.refresh_from_db()
    assert run.state == RunState.RUNNING


def test_writes_before_a_wait_roll_back_and_commit_once_with_the_resumed_run():
    run = aw.waits.start({"key": "waiter"})
    drain_workflows()
    assert step(run, "writes_then_waits").state == StepState.WAITING
    assert notes("waiter") == []  # the first run's "before" left with the wait
    events.publish("atomic-go", {"ok": True}, key="waiter")
    drain_workflows()
    run.refresh_from_db()
    assert (run.state, run.output) == (RunState.SUCCEEDED, {"ok": True})
    assert notes("waiter") == ["after", "before"]


def test_an_atomic_step_that_maps_commits_its_writes_with_the_children():
    run = aw.mapped.start({"key": "fan"})
    drain_workflows()
    run.refresh_from_db()
    assert (run.state, run.output) == (RunState.SUCCEEDED, [0, 2, 4])
    assert notes("fan") == ["fan", "item:0", "item:1", "item:2"]


def test_progress_in_an_atomic_step_saves_no_checkpoint_and_artifacts_are_refused():
    run = aw.tools.start({"key": "tools"})
    drain_workflows()
    progressed = step(run, "uses_progress")
    assert (progressed.state, progressed.output, progressed.checkpoint) == (
        StepState.SUCCEEDED,
        1,  # the attempt saw its own value
        None,  # but nothing was written to the step row
    )
    artifact = step(run, "saves_an_artifact")
    assert artifact.state == StepState.FAILED
    assert "cannot be used in an atomic step" in artifact.errors[-1]["message"]
    assert notes("tools") == ["progressed"] and not Artifact.objects.exists()
    assert InvalidTask.__name__ in artifact.errors[-1]["exception_class_path"]


def test_an_atomic_step_past_its_timeout_keeps_none_of_its_writes(tmp_path):
    done = tmp_path / "done"
    run = aw.slow.start({"key": "slow", "done": str(done)})
    drain_workflows()  # no process to recycle: the attempt's thread is abandoned
    row = step(run, "overruns")
    assert row.state == StepState.FAILED
    assert "timeout" in row.errors[-1]["message"]
    wait_until(Path(done).exists, what="the abandoned attempt to write and return")
    wait_until(
        lambda: not any(t.name == f"dispatch-step-{row.pk}" for t in threading.enumerate()),
        what="the abandoned attempt's thread to end",
    )
    time.sleep(0.1)
    assert notes("slow") == []  # its late write rolled back with its void claim
