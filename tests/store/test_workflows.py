"""The rest of the workflow store: call context, parking without an attempt,
retention. Steps run through the real worker path. ``run_now``: tests/runtime/test_run_now.py."""

from __future__ import annotations

import time

import pytest

from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import Job, WorkflowRun, WorkflowTask
from django_dispatch.store import workflows as wf_store
from django_dispatch.store.base import now_plus
from django_dispatch.workflows import retry_run
from django_dispatch.workflows.testing import drain_workflows
from tests.conftest import wait_until
from tests.testapp import wait_workflows as wfs

pytestmark = pytest.mark.django_db(transaction=True)


def step_of(run: WorkflowRun, name: str) -> WorkflowTask:
    return WorkflowTask.objects.get(run=run, name=name)


def test_call_context_is_stored_and_reaches_every_step_and_child_runs():
    context = {"request_id": "req-1", "user_id": 42}
    run = wfs.context_parent.start({"key": "ctx"}, context=context)
    assert WorkflowRun.objects.get(pk=run.pk).call_context == context
    drain_workflows()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED
    assert run.output == {"parent_context": context, "child": {"child_context": context}}
    child = WorkflowRun.objects.get(parent_run=run)
    assert child.call_context == context


def test_call_context_must_be_json_and_nothing_is_written():
    from django_dispatch.exceptions import InvalidTaskArguments

    with pytest.raises(InvalidTaskArguments, match="call context"):
        wfs.context_parent.start({"key": "bad"}, context={"user": object()})
    assert not WorkflowRun.objects.exists() and not Job.objects.exists()


def test_an_output_that_is_not_json_parks_the_run_without_counting_an_attempt():
    run = wfs.unstorable.start({"key": "set"})
    drain_workflows()
    run.refresh_from_db()
    step = step_of(run, "returns_a_set")
    assert run.state == RunState.STUCK and step.state == StepState.FAILED
    assert (step.attempts, step.failures) == (1, 0)  # max_attempts=3, none spent
    assert step.errors[-1]["counted"] is False
    assert "JSON" in step.errors[-1]["message"]


def test_retrying_a_parked_step_that_saved_an_artifact_runs_as_the_next_attempt(settings):
    """The parked attempt's artifact is linked under its attempt number; the retry
    after the fix is a new attempt, so saving the same name is no ``ArtifactExists``
    (shown to fail when a park took the attempt number back)."""
    from django_dispatch import artifacts
    from tests.testapp.models import SideEffect

    memory = {"BACKEND": "django.core.files.storage.InMemoryStorage"}
    settings.STORAGES = {**settings.STORAGES, "artifacts": memory}
    settings.DISPATCH = {**settings.DISPATCH, "ARTIFACT_STORAGE": "artifacts"}
    run = wfs.reporting.start({"key": "rep"})
    drain_workflows()
    run.refresh_from_db()
    step = step_of(run, "report")
    assert run.state == RunState.STUCK and (step.attempts, step.failures) == (1, 0)
    SideEffect.objects.create(key="rep", note="fixed")  # the deploy fixed the code
    assert retry_run(run.pk) is True
    drain_workflows()
    run.refresh_from_db()
    step = step_of(run, "report")
    assert run.state == RunState.SUCCEEDED, step.errors
    assert [e.get("counted") for e in step.errors] == [False]  # only the park
    assert (run.output["attempt"], step.attempts, step.failures) == (2, 2, 0)
    links = [(link.generation, link.attempt) for link in artifacts.links(step)]
    assert links == [(1, 2), (1, 1)]
    with artifacts.open(artifacts.find(step, "report")) as f:
        assert f.read() == b"attempt 2"


def test_a_step_no_longer_defined_parks_the_run_without_counting_an_attempt():
    run = wfs.sleeper.start({"key": "gone", "seconds": 0})
    WorkflowTask.objects.filter(run=run).update(handler_path="tests.testapp.nowhere.step")
    drain_workflows()
    run.refresh_from_db()
    step = step_of(run, "nap")
    assert run.state == RunState.STUCK and step.state == StepState.FAILED
    assert (step.attempts, step.failures) == (1, 0)
    assert "tests.testapp.nowhere.step" in step.errors[-1]["message"]
    # fixed (the deploy brought it back): a retry runs it
    WorkflowTask.objects.filter(run=run).update(handler_path="tests.testapp.wait_workflows.nap")
    assert retry_run(run.pk) is True
    drain_workflows()
    run.refresh_from_db()
    assert (
        run.state == RunState.SUCCEEDED and step_of(run, "nap").attempts == 3
    )  # park, sleep, wake


def test_retention_purges_old_finished_runs_in_batches_and_keeps_live_ones():
    done = [wfs.sleeper.start({"key": f"d{i}", "seconds": 0}) for i in range(3)]
    stuck = wfs.unstorable.start({"key": "stuck"})
    drain_workflows()
    parent = wfs.context_parent.start({"key": "p"})
    drain_workflows()  # parent and child succeeded
    WorkflowRun.objects.filter(state__in=[RunState.SUCCEEDED]).update(finished_at=now_plus(-100))
    live_parent = wfs.awaits.start({"key": "lp", "event_key": "x"})
    live_child = WorkflowRun.objects.create(
        name="tests.context_child", state=RunState.SUCCEEDED, parent_run=live_parent
    )
    WorkflowRun.objects.filter(pk=live_child.pk).update(finished_at=now_plus(-100))
    deleted = wf_store.workflow_runs_purge(50, batch=2, max_seconds=10)
    remaining = set(WorkflowRun.objects.values_list("pk", flat=True))
    assert not remaining & {r.pk for r in done}
    assert parent.pk not in remaining
    assert {stuck.pk, live_parent.pk, live_child.pk} <= remaining
    assert deleted >= 4
    assert not WorkflowTask.objects.filter(run_id__in=[r.pk for r in done]).exists()


@pytest.mark.slow
def test_a_step_over_its_timeout_that_ignores_the_stop_is_ended_by_recycling(start_worker):
    """As for a task: asked to stop at the step's timeout, still running a grace period
    later, so ``rundispatch`` recycles its process; the step's next attempt runs."""
    from tests.testapp.models import SideEffect

    overrides = {"TIMEOUT_GRACE": 0.5}
    worker = start_worker("--concurrency", "2", overrides=overrides)
    run = wfs.stuck.start({"key": "stuck"})
    wait_until(
        lambda: WorkflowRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED,
        timeout=60,
        what="the run to succeed after the recycle",
    )
    worker.wait_for_output("recycling the worker process")
    ticks = SideEffect.objects.filter(key="stuck", note="tick").count()
    time.sleep(0.5)
    assert SideEffect.objects.filter(key="stuck", note="tick").count() == ticks  # ended
    assert SideEffect.objects.filter(key="stuck", note="second attempt").count() == 1
    step = step_of(run, "never_returns")
    assert step.attempts == 2 and step.errors  # the lost attempt is on record


def test_the_leaders_purge_deletes_old_acked_events_and_finished_runs():
    from dataclasses import replace

    from django_dispatch import events
    from django_dispatch.conf import get_settings
    from django_dispatch.models import Event
    from django_dispatch.runtime.maintenance import Maintenance

    old_run = wfs.sleeper.start({"key": "purged", "seconds": 0})
    drain_workflows()
    WorkflowRun.objects.filter(pk=old_run.pk).update(finished_at=now_plus(-100))
    acked = events.publish("purge.me")
    assert events.ack(acked)
    Event.objects.filter(pk=acked).update(acked_at=now_plus(-100))
    unacked = events.publish("keep.me")
    settings = replace(get_settings(), EVENT_RETENTION=50.0, WORKFLOW_RETENTION=50.0)
    maintenance = Maintenance("purger", settings, "default")
    maintenance.purge()  # not the leader: nothing
    assert Event.objects.filter(pk=acked).exists()
    maintenance.leader = True
    maintenance.purge()
    assert list(Event.objects.values_list("pk", flat=True)) == [unacked]
    assert not WorkflowRun.objects.filter(pk=old_run.pk).exists()
