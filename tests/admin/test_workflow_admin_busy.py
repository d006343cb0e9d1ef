"""The workflow admin's change-page actions beside a busy worker (SQLite's single writer)."""

from __future__ import annotations

import html

import pytest
from django.urls import reverse

from django_dispatch import enqueue_many
from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import Job, WorkflowRun, WorkflowTask
from django_dispatch.states import JobState
from django_dispatch.workflows.testing import drain_workflows
from tests.conftest import wait_until
from tests.testapp import tasks
from tests.testapp import workflows as wfs


def post_change_form_action(client, model: str, pk: int, action: str) -> str:
    """Run ``action`` from the object's change page; the page it redirects to, as text."""
    change = reverse(f"admin:django_dispatch_{model}_change", args=[pk])
    response = client.post(
        change, {"CHANGE_FORM-action": action, "_selected_action": str(pk), "index": "0"}
    )
    assert response.status_code == 302 and response["Location"] == change, (model, action)
    return html.unescape(client.get(change).content.decode())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_workflow_change_page_actions_succeed_while_a_worker_commits(admin_client, start_worker):
    """Cancelling a run and skipping a step from their pages work while a worker commits.

    The actions write inside ``changeform_view``'s transaction, which read
    the object first: on SQLite that fails at once ("database is locked")
    when a worker committed in between, unless the page took the write lock
    first. A failing action raises here (the test client re-raises).
    """
    rounds = 3
    runs = [wfs.gated.start({"key": f"busy-{i}"}) for i in range(rounds * 2)]
    drain_workflows()  # every run parks on its closed gate before the worker starts
    assert set(WorkflowRun.objects.values_list("state", flat=True)) == {RunState.STUCK}

    def succeeded() -> int:
        return Job.objects.filter(
            state=JobState.SUCCEEDED, task_path="tests.testapp.tasks.noop"
        ).count()

    def wait_for_commits(since: int) -> None:
        wait_until(lambda: succeeded() > since, what="the worker committing")

    enqueue_many(tasks.noop, [([i], {}) for i in range(1000)])
    worker = start_worker("--concurrency", "4")
    wait_until(lambda: succeeded() or worker.popen.poll() is not None, what="the worker")
    assert worker.popen.poll() is None, worker.output()
    for i in range(rounds):
        enqueue_many(tasks.noop, [([i], {}) for i in range(300)])  # the worker stays busy
        wait_for_commits(succeeded())  # each round starts while the worker is committing
        to_cancel, to_skip = runs[2 * i], runs[2 * i + 1]
        text = post_change_form_action(admin_client, "workflowrun", to_cancel.pk, "cancel_runs")
        assert "1 cancelled." in text
        gate = WorkflowTask.objects.get(run=to_skip, name="gate")
        text = post_change_form_action(admin_client, "workflowtask", gate.pk, "skip_steps")
        assert "1 skipped." in text
        gate.refresh_from_db()
        assert gate.state == StepState.SKIPPED
    to_cancel_ids = [run.pk for run in runs[::2]]
    assert set(
        WorkflowRun.objects.filter(pk__in=to_cancel_ids).values_list("state", flat=True)
    ) == {RunState.CANCELLED}
    assert worker.popen.poll() is None, worker.output()
