"""The admin's queue page: state and backlog of every queue,
pause/resume buttons under a permission and CSRF."""

from __future__ import annotations

import html

import pytest
from django.test import Client
from django.urls import reverse

from django_dispatch import pause_queue, paused_queues
from tests.testapp import flow_tasks

pytestmark = pytest.mark.django_db(transaction=True)
URL = "admin:django_dispatch_pausedqueue_changelist"


def text(response) -> str:
    return html.unescape(response.content.decode())


def test_the_page_lists_queues_and_pauses_and_resumes(client, login):
    flow_tasks.mark.using(queue_name="emails").enqueue("a")
    flow_tasks.mark.using(queue_name="emails").enqueue("b")
    pause_queue("reports")
    login("pause_queue")
    page = text(client.get(reverse(URL)))
    assert "emails" in page and "Active" in page and ">2<" in page
    assert "reports" in page and "Paused" in page
    assert 'value="pause"' in page and 'value="resume"' in page

    done = client.post(reverse(URL), {"action": "pause", "queue": "emails"}, follow=True)
    assert "Queue 'emails' paused" in text(done)
    assert paused_queues() == {"emails", "reports"}
    again = client.post(reverse(URL), {"action": "pause", "queue": "emails"}, follow=True)
    assert "already paused" in text(again)
    client.post(reverse(URL), {"action": "resume", "queue": "reports"})
    assert paused_queues() == {"emails"}
    bad = client.post(reverse(URL), {"action": "pause", "queue": ""}, follow=True)
    assert "name must be a non-empty string" in text(bad)


def test_viewing_without_the_permission_shows_no_buttons_and_refuses_posts(client, login):
    pause_queue("reports")
    login("view_pausedqueue")
    page = text(client.get(reverse(URL)))
    assert "reports" in page and 'value="resume"' not in page
    assert client.post(reverse(URL), {"action": "resume", "queue": "reports"}).status_code == 403
    assert paused_queues() == {"reports"}


def test_no_permission_no_page(client, login):
    login()
    assert client.get(reverse(URL)).status_code == 403


def test_posts_need_the_csrf_token(django_user_model):
    user = django_user_model.objects.create_superuser("root", "r@x.test", "pw")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    response = strict.post(reverse(URL), {"action": "pause", "queue": "emails"})
    assert response.status_code == 403
    assert paused_queues() == set()


def test_the_page_shows_groups_at_their_cap(client, login):
    from django_dispatch import store

    for i in range(4):
        flow_tasks.capped.using(concurrency_key="cust-7").enqueue(f"c{i}")
    store.jobs_claim(worker_id="w", queues=(), limit=10, lease_seconds=30)
    login("view_pausedqueue")
    page = text(client.get(reverse(URL)))
    assert "Limits at their cap" in page
    assert "cust-7" in page and "3 / 3" in page
