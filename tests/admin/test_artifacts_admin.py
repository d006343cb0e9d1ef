"""The artifacts admin: downloads are permission-checked, "delete now" goes through
the store, and job, run and step pages list their artifacts."""

from __future__ import annotations

import html

import pytest
from django.urls import reverse

from django_dispatch import artifacts
from django_dispatch.models import Artifact
from django_dispatch.testing import drain
from tests.testapp import artifact_tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def saved(settings, tmp_path):
    """A job that saved report.txt, into a FileSystemStorage in a temporary directory."""
    settings.STORAGES = {
        **settings.STORAGES,
        "artifacts": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "media")},
        },
    }
    settings.DISPATCH = {**settings.DISPATCH, "ARTIFACT_STORAGE": "artifacts"}
    result = artifact_tasks.save_report.enqueue("admin")
    drain()
    return result, artifacts.find(result.id, "report.txt")


def download(client, artifact):
    return client.get(reverse("admin:django_dispatch_artifact_download", args=[artifact.pk]))


def test_anonymous_users_are_sent_to_the_login_page(client, saved):
    response = download(client, saved[1])
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_staff_without_the_permission_are_refused(client, saved, login):
    login("view_artifact", "view_job")
    assert download(client, saved[1]).status_code == 403


def test_non_staff_with_the_permission_are_refused(client, saved, login):
    login("download_artifact", staff=False)
    response = download(client, saved[1])
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_permission_streams_the_file_as_an_attachment(client, saved, login):
    login("download_artifact")
    response = download(client, saved[1])
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"admin attempt 1"
    assert response["Content-Disposition"].startswith("attachment")
    assert response["Content-Type"].startswith("text/plain")
    artifacts.delete(saved[1])
    assert download(client, saved[1]).status_code == 404  # deleted: not served


def test_job_page_lists_its_artifacts(client, saved, login):
    login("view_job")
    result, artifact = saved
    response = client.get(reverse("admin:django_dispatch_job_change", args=[result.id]))
    page = html.unescape(response.content.decode())
    assert "report.txt" in page
    assert reverse("admin:django_dispatch_artifact_download", args=[artifact.pk]) in page


def test_run_and_step_pages_list_their_artifacts(client, saved, login):
    login("view_workflowrun", "view_workflowtask")
    run = artifact_tasks.exports.start({})
    drain()
    step = run.steps.get(name="export")
    run_page = client.get(reverse("admin:django_dispatch_workflowrun_change", args=[run.pk]))
    assert run_page.status_code == 200
    step_page = client.get(reverse("admin:django_dispatch_workflowtask_change", args=[step.pk]))
    assert "export.csv" in html.unescape(step_page.content.decode())


def test_delete_now_needs_its_permission_and_deletes_file_and_record(client, saved, login):
    _, artifact = saved
    storage = __import__("django.core.files.storage").core.files.storage.storages["artifacts"]
    changelist = reverse("admin:django_dispatch_artifact_changelist")
    data = {"action": "delete_now", "_selected_action": [str(artifact.pk)], "index": "0"}
    login("view_artifact")
    client.post(changelist, data, follow=True)
    assert Artifact.objects.filter(pk=artifact.pk, deleted_at=None).exists()
    login("view_artifact", "delete_artifact_now")
    response = client.post(changelist, data, follow=True)
    assert "1 deleted" in response.content.decode()
    assert not Artifact.objects.filter(pk=artifact.pk).exists()
    assert not storage.exists(artifact.name)


def test_the_list_filters_live_and_deleted(client, saved, login):
    login("view_artifact")
    _, artifact = saved
    changelist = reverse("admin:django_dispatch_artifact_changelist")
    assert client.get(changelist, {"live": "yes"}).context["cl"].result_count == 1
    assert client.get(changelist, {"live": "no"}).context["cl"].result_count == 0
    artifacts.delete(artifact)
    assert client.get(changelist, {"live": "no"}).context["cl"].result_count == 1
