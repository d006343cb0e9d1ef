"""The jobs admin and the call context: shown on the job's page, searched, filtered."""

from __future__ import annotations

import html

import pytest
from django.urls import reverse

from django_dispatch.models import DeadLetter
from django_dispatch.testing import drain
from tests.testapp import context_tasks, tasks

CHANGELIST = "admin:django_dispatch_job_changelist"

pytestmark = pytest.mark.django_db(transaction=True)


def _ids(client, **query) -> set[str]:
    response = client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    return {str(result.pk) for result in response.context["cl"].result_list}


@pytest.fixture
def jobs():
    alice = tasks.add.using(call_context={"user": "alice", "ip": "10.0.0.1"}).enqueue(1, 2)
    bob = tasks.add.using(call_context={"user": "bob"}).enqueue(1, 2)
    none = tasks.add.enqueue(1, 2)
    kwarg = tasks.record.enqueue(key="alice")  # "alice" in its arguments, not its context
    return alice.id, bob.id, none.id, kwarg.id


def test_the_filter_tells_jobs_with_a_call_context(client, login, jobs):
    login(superuser=True)
    alice, bob, none, kwarg = jobs
    assert _ids(client, call_context="set") == {alice, bob}
    assert _ids(client, call_context="none") == {none, kwarg}
    assert _ids(client) == {alice, bob, none, kwarg}


def test_a_json_search_finds_the_call_context_or_the_keyword_arguments(client, login, jobs):
    login(superuser=True)
    alice, bob, _, kwarg = jobs
    assert _ids(client, q='{"user": "bob"}') == {bob}
    assert _ids(client, q='{"key": "alice"}') == {kwarg}
    assert _ids(client, q='{"user": "alice"}', call_context="set") == {alice}


def test_a_text_search_reads_the_call_context(client, login, jobs):
    login(superuser=True)
    assert _ids(client, q="10.0.0.1") == {jobs[0]}


def test_the_job_and_dead_letter_pages_show_it(client, login):
    login(superuser=True)
    failed = context_tasks.always_fails.using(call_context={"user": "carol"}).enqueue()
    drain()
    page = client.get(reverse("admin:django_dispatch_job_change", args=[failed.id]))
    text = html.unescape(page.content.decode())
    assert "Call context" in text and '"carol"' in text
    letter = DeadLetter.objects.get(job_id=failed.id)
    page = client.get(reverse("admin:django_dispatch_deadletter_change", args=[letter.pk]))
    assert '"carol"' in html.unescape(page.content.decode())
