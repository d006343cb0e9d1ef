"""A workflow run's page as a console: its steps drawn as a graph, the replay page
in the admin's current markup, and operator actions in the run's history."""

from __future__ import annotations

import html

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from django_dispatch.workflows.testing import drain_workflows
from tests.testapp import workflows as wfs


def page(response) -> str:
    return html.unescape(response.content.decode())


@pytest.fixture
def boss(client, django_user_model):
    user = django_user_model.objects.create_superuser("boss", "b@x.test", "pw")
    client.force_login(user)
    return user


@pytest.mark.django_db(transaction=True)
def test_the_run_page_draws_its_steps_coloured_by_state(client, boss):
    run = wfs.gated.start({"key": "dag"})
    drain_workflows()
    text = page(client.get(reverse("admin:django_dispatch_workflowrun_change", args=[run.pk])))
    start = text.index('<div class="dispatch-dag">')
    svg = text[start : text.index("</svg>", start)]
    assert '<g class="node ok" data-step="prepare">' in svg
    assert '<g class="node failed" data-step="gate">' in svg
    assert '<g class="node pending" data-step="finish">' in svg
    assert svg.count('class="edge"') == 2  # prepare -> gate -> finish
    # prepare left of gate, gate left of finish: one layer per dependency.
    xs = {
        name: float(svg.split(f'data-step="{name}">', 1)[1].split('x="', 1)[1].split('"')[0])
        for name in ("prepare", "gate", "finish")
    }
    assert xs["prepare"] < xs["gate"] < xs["finish"]


@pytest.mark.django_db(transaction=True)
def test_replay_page_markup_and_workflow_actions_in_the_history(client, boss):
    run = wfs.gated.start({"key": "hist"})
    drain_workflows()
    change = reverse("admin:django_dispatch_workflowrun_change", args=[run.pk])
    replay = page(client.get(reverse("admin:django_dispatch_workflowrun_replay", args=[run.pk])))
    assert '<nav aria-label="Breadcrumbs">' in replay
    assert f'<a role="button" href="{change}" class="closelink">Cancel</a>' in replay
    data = {"action": "skip_current_steps", "_selected_action": [str(run.pk)], "index": "0"}
    client.post(reverse("admin:django_dispatch_workflowrun_changelist"), data)
    entries = list(LogEntry.objects.values_list("object_id", "change_message"))
    assert (str(run.pk), "had their step skipped (admin action).") in entries
    history = page(client.get(reverse("admin:django_dispatch_workflowrun_history", args=[run.pk])))
    assert "had their step skipped (admin action)." in history
