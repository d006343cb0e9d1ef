"""The change lists' rows (``admin.rows``) are Django's, byte for byte, only cheaper.

Each list is rendered, then its rows are rendered again by Django's own
``items_for_result`` and compared; only the relative times differ between
two renders ("3 s ago", ``data-age``), and only those are blanked.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.templatetags.admin_list import results
from django.urls import reverse
from django.utils import timezone

from django_dispatch import services, store
from django_dispatch.admin import rows
from django_dispatch.admin.rows import page_results, row_cells
from django_dispatch.models import CronEntry, DeadLetter, Job
from django_dispatch.testing import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: What changes between two renders a moment apart: relative times and running durations.
MOVING = [
    (re.compile(r'data-age="[^"]*"'), 'data-age=""'),
    (re.compile(r"(<time[^>]*>)[^<]*(</time>)"), r"\1\2"),
    (re.compile(r"<em>[^<]*</em>"), "<em></em>"),
]


def steady(text: str) -> str:
    for pattern, replacement in MOVING:
        text = pattern.sub(replacement, text)
    return text


def rows_of(response) -> tuple[list[str], list[str]]:
    """(ours, Django's) rows of the change list just rendered."""
    cl = response.context["cl"]
    ours = ["".join(row) for row in page_results(cl)]
    django = ["".join(row) for row in results(cl)]
    return [steady(r) for r in ours], [steady(r) for r in django]


@pytest.fixture
def history(transactional_db):
    """Jobs in most states and shapes, dead letters (one replayed), a cron entry, a worker."""
    tasks.add.enqueue(1, 2)
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(3, 4)
    keyed = tasks.add.using(partition_key="customer-<7>&").enqueue(5, 6)
    tasks.add.using(partition_key="customer-<7>&").enqueue(7, 8)
    for message in ("boom <b>bold</b> & more", "x" * 200):
        tasks.fail_always.enqueue(message)
    drain()
    services.cancel(tasks.add.using(run_after=timezone.now() + timedelta(days=1)).enqueue(1, 1).id)
    letter = DeadLetter.objects.order_by("id").first()
    services.replay(letter.pk, replayed_by="tests")
    CronEntry.objects.create(name="nightly", schedule="0 3 * * *", task_path="a.b", enabled=False)
    store.worker_register("w-<1>", hostname="host", pid=123, queues=["emails"], concurrency=4)
    return keyed


@pytest.mark.parametrize(
    "model, query",
    [
        ("job", ""),
        ("job", "?state__exact=failed"),
        ("job", "?state__exact=failed&o=1"),
        ("job", "?q=customer"),
        ("deadletter", ""),
        ("deadletter", "?replayed=no"),
        ("cronentry", ""),
        ("worker", ""),
        ("workflowrun", ""),
    ],
)
def test_rows_are_djangos(admin_client, history, model, query):
    response = admin_client.get(reverse(f"admin:django_dispatch_{model}_changelist") + query)
    assert response.status_code == 200
    ours, django = rows_of(response)
    assert ours == django
    assert row_cells(response.context["cl"]) is not None  # ours, not the fallback
    for row in ours:  # and they are on the page, as rendered
        assert row in steady(response.content.decode())


def test_links_keep_the_lists_filters(admin_client, history):
    query = "?state__exact=failed"
    response = admin_client.get(reverse("admin:django_dispatch_job_changelist") + query)
    ours, _ = rows_of(response)
    failed = Job.objects.filter(state="failed").order_by("-id")
    assert len(ours) == failed.count() == 2
    for row, job in zip(ours, failed, strict=True):
        change = reverse("admin:django_dispatch_job_change", args=[job.pk])
        kept = "_changelist_filters=state__exact%3Dfailed"
        assert f'<th class="field-id"><a href="{change}?{kept}">' in row


def test_a_column_it_does_not_cover_is_left_to_django(admin_client, history, monkeypatch):
    job_admin = admin.site._registry[Job]
    monkeypatch.setattr(job_admin, "list_display", ["id", "__str__", "state_badge"])
    response = admin_client.get(reverse("admin:django_dispatch_job_changelist"))
    assert response.status_code == 200
    cl = response.context["cl"]
    assert row_cells(cl) is None
    assert len(page_results(cl)) == Job.objects.count()
    assert str(Job.objects.order_by("-id").first()) in response.content.decode()


@pytest.mark.parametrize(
    "model, query",
    [("job", ""), ("job", "?state__exact=failed"), ("deadletter", "")],
)
def test_joined_rows_render_the_same_page(admin_client, history, monkeypatch, model, query):
    """The rows joined into one item (``rows.joined``) make the very page Django's
    template makes of them one by one."""
    changelist = reverse(f"admin:django_dispatch_{model}_changelist") + query
    token = re.compile(r'(name="csrfmiddlewaretoken" value=)"[^"]*"')
    response = admin_client.get(changelist)
    cl = response.context["cl"]
    pages = [token.sub(r"\1", steady(response.content.decode()))]
    assert len(rows.joined(cl, rows.page_results(cl))) == 1 < len(rows.page_results(cl))
    monkeypatch.setattr(rows, "joined", lambda cl, found: found)
    pages.append(token.sub(r"\1", steady(admin_client.get(changelist).content.decode())))
    assert pages[0] == pages[1]
    assert pages[0].count("<tr>") >= len(cl.result_list) >= 2


def test_a_rows_template_of_its_own_gets_the_rows_one_by_one(admin_client, history, monkeypatch):
    """Where a project's template renders the rows (not Django's), it gets them apart."""
    response = admin_client.get(reverse("admin:django_dispatch_job_changelist"))
    cl = response.context["cl"]
    found = rows.page_results(cl)
    monkeypatch.setattr(rows, "STOCK_ROWS", rows.STOCK_ROWS / "elsewhere")
    assert rows.joined(cl, found) == found
