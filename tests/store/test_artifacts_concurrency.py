"""Artifacts under concurrency and failure: racing creates, a failing storage, a real worker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.files.storage import storages
from django.utils import timezone

from django_dispatch import artifacts
from django_dispatch.exceptions import ArtifactExists
from django_dispatch.models import Artifact, Job
from django_dispatch.store import artifacts as artifact_store
from tests.artifact_storages import FailingDeleteStorage
from tests.concurrency import run_concurrently
from tests.conftest import wait_until
from tests.testapp import artifact_tasks

pytestmark = pytest.mark.django_db(transaction=True)


def _create(name):
    def create():
        try:
            return artifact_store.artifact_create(storage="default", name=name)
        except ArtifactExists as e:
            return e

    return create


def test_two_concurrent_creates_at_one_storage_name_one_wins():
    for round_ in range(10):
        name = f"dispatch/race/{round_}.bin"
        outcomes = run_concurrently(_create(name), _create(name), together=True)
        won = [o for o in outcomes if isinstance(o, Artifact)]
        lost = [o for o in outcomes if isinstance(o, ArtifactExists)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert "already holds" in str(lost[0])
        assert Artifact.objects.filter(name=name).count() == 1


@pytest.fixture
def failing_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "flaky": {
            "BACKEND": "tests.artifact_storages.FailingDeleteStorage",
            "OPTIONS": {"location": str(tmp_path / "flaky")},
        },
    }
    settings.DISPATCH = {**settings.DISPATCH, "ARTIFACT_STORAGE": "flaky"}
    FailingDeleteStorage.failures = 0
    FailingDeleteStorage.attempts = 0
    return storages["flaky"]


def test_a_storage_error_keeps_the_record_and_the_next_sweep_retries(failing_storage):
    result = artifact_tasks.save_report.enqueue("flaky")
    from django_dispatch.testing import drain

    drain()
    artifact = artifacts.find(result.id, "report.txt")
    assert failing_storage.exists(artifact.name)
    artifacts.delete(artifact)
    Artifact.objects.filter(pk=artifact.pk).update(deleted_at=timezone.now() - timedelta(days=2))
    FailingDeleteStorage.failures = 1
    counts = artifact_store.artifacts_sweep(orphan_seconds=60, purge_grace=60, batch=10)
    assert (counts.purged, counts.purge_failed) == (0, 1)
    assert FailingDeleteStorage.attempts == 1
    assert artifacts.get_record(artifact.pk).deleted_at is not None  # still tracked
    assert failing_storage.exists(artifact.name)
    counts = artifact_store.artifacts_sweep(orphan_seconds=60, purge_grace=60, batch=10)
    assert (counts.purged, counts.purge_failed) == (1, 0)
    assert FailingDeleteStorage.attempts == 2
    assert not failing_storage.exists(artifact.name)
    assert not Artifact.objects.filter(pk=artifact.pk).exists()


def test_delete_now_purges_at_once_or_keeps_the_record_on_error(failing_storage):
    a = artifact_store.artifact_create(storage="flaky", name="dispatch/now-a.bin")
    b = artifact_store.artifact_create(storage="flaky", name="dispatch/now-b.bin")
    for artifact in (a, b):
        failing_storage.save(artifact.name, __import__("io").BytesIO(b"x"))
    FailingDeleteStorage.failures = 1
    assert artifact_store.artifacts_delete_now([a.pk, b.pk]) == (1, 1)
    left = Artifact.objects.get()
    assert left.deleted_at is not None and failing_storage.exists(left.name)


@pytest.mark.slow
def test_a_real_worker_saves_an_artifact(start_worker, settings, tmp_path):
    media = tmp_path / "media"
    settings.MEDIA_ROOT = str(media)
    result = artifact_tasks.save_report.enqueue("worker", fail_until=1)
    worker = start_worker(env={"DISPATCH_TEST_MEDIA_ROOT": str(media)})
    wait_until(lambda: Job.objects.get(pk=result.id).state == "succeeded", what=worker.output)
    newest = artifacts.find(result.id, "report.txt")
    assert newest is not None
    with artifacts.open(newest) as f:
        assert f.read() == b"worker attempt 2"
    assert (media / newest.name).is_file()
    assert len(artifacts.for_owner(result.id)) == 2


def test_a_save_racing_a_takeover_links_only_while_its_lease_holds(settings, tmp_path):
    """The save's fenced link and another worker's takeover, started together:
    whichever wins, the save returns exactly when its link exists, and a save
    that lost raised JobCancelled because the takeover happened."""
    from datetime import timedelta

    from django_dispatch import store
    from django_dispatch.exceptions import JobCancelled
    from django_dispatch.models import ArtifactLink
    from django_dispatch.tasks.context import DispatchTaskContext

    settings.MEDIA_ROOT = str(tmp_path / "media")
    outcomes = set()
    for round_ in range(int(__import__("os").environ.get("RACE_ROUNDS", 8))):
        result = artifact_tasks.save_report.enqueue(f"race {round_}")
        (claimed,) = store.jobs_claim(worker_id="w1", queues=[], limit=1, lease_seconds=30)
        context = DispatchTaskContext(
            task_result=artifact_tasks.save_report.get_result(result.id),
            lease=claimed.lease,
            lease_seconds=30,
        )

        def save(context=context):
            try:
                return context.save_artifact("report.txt", b"from w1")
            except JobCancelled as e:
                return e

        def take_over(result=result):
            Job.objects.filter(pk=result.id).update(
                lease_expires_at=timezone.now() - timedelta(seconds=1)
            )
            store.jobs_rescue_expired(max_worker_lost=3)
            return store.jobs_claim(worker_id="w2", queues=[], limit=1, lease_seconds=30)

        saved, taken = run_concurrently(save, take_over, together=True)
        # A stale save's fence check may keep the row locked until its short
        # transaction ends (PostgreSQL locks the new row version before
        # rechecking it), so the racing claim may have skipped it: claim again.
        taken = taken or store.jobs_claim(worker_id="w2", queues=[], limit=1, lease_seconds=30)
        linked = ArtifactLink.objects.filter(owner_id=result.id).exists()
        if isinstance(saved, JobCancelled):
            row = Job.objects.filter(pk=result.id).values(
                "state", "worker_id", "lease_epoch", "run_after", "attempts"
            )
            assert taken and not linked, (list(row), saved)
            outcomes.add("lost")
        else:
            assert linked and artifacts.find(result.id, "report.txt") == saved
            outcomes.add("linked")
        Job.objects.filter(pk=result.id).delete()
    assert outcomes  # each round ended one way or the other, consistently


def test_a_link_being_inserted_while_the_owner_sweep_runs_keeps_the_artifact(settings, tmp_path):
    """The artifact's first owner is purged, and a link to a live owner is being
    inserted (its transaction still open) while the owner-gone sweep runs. The
    sweep locks its candidates before reading their links, so it skips the
    artifact (PostgreSQL: the insert holds it) or waits for the insert's
    commit (SQLite: the write lock), then sees the link: nothing is deleted."""
    import threading

    from django.db import transaction

    from django_dispatch.testing import drain

    settings.MEDIA_ROOT = str(tmp_path / "media")
    made = artifact_tasks.save_report.enqueue("linked while sweeping")
    drain()
    report = artifacts.find(made.id, "report.txt")
    user = artifact_tasks.save_report.enqueue("user")  # stays queued: a live owner
    Job.objects.filter(pk=made.id).delete()  # purged: its artifact is a candidate
    inserted, swept = threading.Event(), threading.Event()

    def link():
        with transaction.atomic():
            spec = artifact_store.LinkSpec("job", int(user.id), "input.txt", 0, role="input")
            artifact_store.artifact_link(report.pk, spec)
            inserted.set()
            swept.wait(2.0)  # SQLite: the sweep waits for this commit instead

    def sweep():
        assert inserted.wait(10.0)
        try:
            return artifact_store.artifacts_sweep_owner_gone(batch=10)
        finally:
            swept.set()

    _, (soft_deleted, _) = run_concurrently(link, sweep)
    assert soft_deleted == 0
    assert artifacts.get(report.pk) == report
    assert artifact_store.artifacts_sweep_owner_gone(batch=10) == (0, 0)  # the link is seen
    assert artifacts.get(report.pk) == report
