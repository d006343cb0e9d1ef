"""Resources and usage in the admin and in dispatch_status."""

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse

from django_dispatch import store
from django_dispatch.models import JobUsage, Worker
from django_dispatch.testing import drain
from tests.testapp import resource_tasks as rt
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_client(client):
    user = User.objects.create_superuser("admin", "a@example.com", "pw")
    client.force_login(user)
    return client


def test_job_page_shows_needs_a_warning_and_one_line_per_attempt(admin_client):
    big = rt.big.using(locality="eu").enqueue("k")
    page = admin_client.get(reverse("admin:django_dispatch_job_change", args=[big.id]))
    text = page.content.decode()
    assert page.status_code == 200
    assert "memory_mb" in text and "eu" in text
    assert "No live worker has the capacity for this job" in text
    store.worker_register(
        "w-big", hostname="h", pid=1, queues=[], concurrency=1, capacity={"memory_mb": 1000}
    )
    text = admin_client.get(reverse("admin:django_dispatch_job_change", args=[big.id]))
    assert "No live worker has the capacity" not in text.content.decode()

    failed = rt.fails.enqueue("x")
    drain()
    text = admin_client.get(reverse("admin:django_dispatch_job_change", args=[failed.id]))
    body = text.content.decode()
    assert body.count("<td>failed</td>") == 2  # attempts 1 and 2


def test_usage_list_and_summary_pages(admin_client):
    for _ in range(3):
        tasks.add.enqueue(1, 2)
    drain()
    assert JobUsage.objects.count() == 3
    listing = admin_client.get(reverse("admin:django_dispatch_jobusage_changelist"))
    assert listing.status_code == 200 and "tests.testapp.tasks.add" in listing.content.decode()
    summary = admin_client.get(reverse("admin:django_dispatch_jobusage_summary"))
    body = summary.content.decode()
    assert summary.status_code == 200 and "tests.testapp.tasks.add" in body
    assert "<td>3</td>" in body
    assert (
        admin_client.get(reverse("admin:django_dispatch_jobusage_summary") + "?hours=x").status_code
        == 200
    )


def test_worker_page_shows_capacity(admin_client):
    store.worker_register(
        "w-gpu", hostname="h", pid=1, queues=[], concurrency=1, capacity={"gpu": 2}, locality="eu"
    )
    assert Worker.objects.get(pk="w-gpu").capacity == {"gpu": 2}
    page = admin_client.get(reverse("admin:django_dispatch_worker_changelist"))
    assert "gpu" in page.content.decode()


def test_dispatch_status_warns_about_jobs_no_live_worker_can_hold():
    rt.on_gpu.enqueue("g")
    rt.big.enqueue("b")
    store.worker_register(
        "w-mem", hostname="h", pid=1, queues=[], concurrency=1, capacity={"memory_mb": 1000}
    )
    out, err = StringIO(), StringIO()
    call_command("dispatch_status", stdout=out, stderr=err)
    assert 'capacity={"memory_mb":1000}' in out.getvalue()
    assert 'need {"gpu":1}' in err.getvalue()
    assert "memory_mb" not in err.getvalue()  # the worker can hold that one
