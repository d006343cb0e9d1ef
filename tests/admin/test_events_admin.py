"""The events admin and the waiting runs in the workflows admin, through Django's test client."""

from __future__ import annotations

import html

import pytest
from django.urls import reverse

from django_dispatch import events
from django_dispatch.core.workflow_states import StepState
from django_dispatch.models import Event, WorkflowRun
from django_dispatch.workflows.testing import drain_workflows
from tests.testapp import wait_workflows as wfs

pytestmark = pytest.mark.django_db(transaction=True)


def url(model: str, view: str, *args: object) -> str:
    return reverse(f"admin:django_dispatch_{model}_{view}", args=args)


def page(response) -> str:
    return html.unescape(response.content.decode())


def test_events_list_filters_by_name_key_and_acked_and_shows_the_payload(client, login):
    login("view_event")
    paid = events.publish("payment", {"amount": 42, "items": [1, 2]}, key="order:1")
    other = events.publish("signup", None, key="user:7")
    assert events.ack(other)
    listing = page(client.get(url("event", "changelist")))
    assert "payment" in listing and "signup" in listing
    assert "Publish an event" not in listing  # no permission to publish
    not_acked = page(client.get(url("event", "changelist"), {"acked": "no"}))
    assert "order:1" in not_acked and "user:7" not in not_acked
    by_key = page(client.get(url("event", "changelist"), {"q": "user:7"}))
    assert "user:7" in by_key and "order:1" not in by_key
    by_name = page(client.get(url("event", "changelist"), {"name": "payment"}))
    assert "order:1" in by_name and "user:7" not in by_name
    detail = page(client.get(url("event", "change", paid)))
    assert '<pre class="dispatch-json">' in detail  # pretty-printed, indented
    assert '  "amount": 42' in detail and "    1,\n    2\n" in detail


def test_publishing_needs_the_permission_even_by_post(client, login):
    login("view_event")
    assert client.get(url("event", "publish")).status_code == 403
    response = client.post(
        url("event", "publish"), {"name": "x", "payload": "1", "backend": "default"}
    )
    assert response.status_code == 403
    assert not Event.objects.exists()


def test_the_publish_form_wakes_a_waiting_run_and_refuses_bad_json(client, login):
    login("view_event", "publish_event", "view_workflowrun", "view_workflowtask")
    run = wfs.awaits.start({"key": "adm", "event_key": "order:9"})
    drain_workflows()
    listing = page(client.get(url("event", "changelist")))
    assert "Publish an event" in listing

    bad = client.post(
        url("event", "publish"),
        {"name": "payment", "key": "order:9", "payload": "{oops", "backend": "default"},
    )
    assert bad.status_code == 200 and "Not JSON" in page(bad)
    assert not Event.objects.exists()

    # the waiting run is shown as such, with what it waits for
    runs = page(client.get(url("workflowrun", "changelist"), {"waiting": "event"}))
    assert f"{run.pk}" in runs
    assert (
        page(client.get(url("workflowrun", "changelist"), {"waiting": "time"})).count(
            f'href="/admin/django_dispatch/workflowrun/{run.pk}/change/"'
        )
        == 0
    )
    detail = page(client.get(url("workflowrun", "change", run.pk)))
    assert "event payment (key order:9)" in detail

    ok = client.post(
        url("event", "publish"),
        {"name": "payment", "key": "order:9", "payload": '{"amount": 5}', "backend": "default"},
        follow=True,
    )
    assert "published" in page(ok)
    event = Event.objects.get()
    assert (event.name, event.key, event.payload) == ("payment", "order:9", {"amount": 5})
    drain_workflows()
    run.refresh_from_db()
    assert run.state == "succeeded" and run.output["got"] == {"amount": 5}


def test_a_sleeping_step_shows_until_when(client, login):
    login("view_workflowtask")
    run = wfs.sleeper.start({"key": "adm-nap", "seconds": 3600})
    drain_workflows()
    step = WorkflowRun.objects.get(pk=run.pk).steps.get()
    assert step.state == StepState.WAITING
    listing = page(client.get(url("workflowtask", "changelist"), {"waiting": "time"}))
    assert "time (sleep) until" in listing
    assert "time (sleep) until" not in page(
        client.get(url("workflowtask", "changelist"), {"waiting": "event"})
    )
