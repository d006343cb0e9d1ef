"""Artifacts: saving from tasks and steps, reading, the lifecycle sweeps, the purge.

Every test runs with a ``FileSystemStorage`` in a temporary directory and with
Django's ``InMemoryStorage``, registered in ``STORAGES`` as ``"artifacts"``;
the file's presence is checked in the storage itself.
"""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import storages
from django.utils import timezone

from django_dispatch import artifacts, store
from django_dispatch.exceptions import ArtifactExists, JobCancelled
from django_dispatch.models import Artifact, ArtifactLink, Job, WorkflowRun
from django_dispatch.store import artifacts as artifact_store
from django_dispatch.tasks.context import DispatchTaskContext
from django_dispatch.testing import drain
from tests.testapp import artifact_tasks

pytestmark = pytest.mark.django_db(transaction=True)

GRACE = 3600.0


@pytest.fixture(params=["filesystem", "memory"])
def storage(request, settings, tmp_path):
    if request.param == "filesystem":
        backend = {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "media")},
        }
    else:
        backend = {"BACKEND": "django.core.files.storage.InMemoryStorage"}
    settings.STORAGES = {**settings.STORAGES, "artifacts": backend}
    settings.DISPATCH = {**settings.DISPATCH, "ARTIFACT_STORAGE": "artifacts"}
    return storages["artifacts"]


def read(artifact: Artifact) -> bytes:
    with artifacts.open(artifact) as f:
        return f.read()


def sweep(**options):
    values = {"orphan_seconds": GRACE, "purge_grace": GRACE, "batch": 100, **options}
    return artifact_store.artifacts_sweep(**values)


def age(artifact: Artifact, **fields_ago: float) -> None:
    """Move an artifact's timestamps into the past (seconds ago)."""
    now = timezone.now()
    Artifact.objects.filter(pk=artifact.pk).update(
        **{field: now - timedelta(seconds=ago) for field, ago in fields_ago.items()}
    )


def test_a_task_saves_an_artifact_linked_to_its_job_and_attempt(storage):
    result = artifact_tasks.save_report.enqueue("k1")
    drain()
    artifact = artifacts.find(result.id, "report.txt")
    assert artifact is not None
    assert read(artifact) == b"k1 attempt 1"
    assert artifact.size == len(b"k1 attempt 1")
    import hashlib

    assert artifact.sha256 == hashlib.sha256(b"k1 attempt 1").hexdigest()
    assert artifact.content_type == "text/plain"
    assert artifact.lifecycle == "ephemeral"
    assert storage.exists(artifact.name)
    assert artifact.name.startswith(f"dispatch/_default/job/{result.id}/a1/")
    (link,) = ArtifactLink.objects.filter(artifact=artifact)
    assert (link.owner_kind, link.owner_id, link.attempt, link.role) == (
        "job",
        int(result.id),
        1,
        "output",
    )
    assert artifacts.get(artifact.pk) == artifact
    assert artifacts.find_by_key("artifacts", artifact.name) == artifact


def test_find_returns_the_newest_of_three_attempts_and_for_owner_lists_them_all(storage):
    result = artifact_tasks.save_report.enqueue("k3", fail_until=2)
    drain()
    assert Job.objects.get(pk=result.id).state == "succeeded"
    newest = artifacts.find(result, "report.txt")
    assert read(newest) == b"k3 attempt 3"
    listed = artifacts.for_owner(result.id)
    assert [read(a) for a in listed] == [b"k3 attempt 3", b"k3 attempt 2", b"k3 attempt 1"]
    assert artifacts.for_owner(result.id, role="log") == []
    # Each attempt has its own file: no attempt overwrote another's output.
    assert len({a.name for a in listed}) == 3


def test_a_file_object_is_streamed_and_hashed(storage, tmp_path):
    import hashlib

    data = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and a bit: several chunks
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    result = artifact_tasks.save_file.enqueue(str(path))
    drain()
    artifact = artifacts.get(Job.objects.get(pk=result.id).return_value)
    assert artifact.size == len(data)
    assert artifact.sha256 == hashlib.sha256(data).hexdigest()
    assert read(artifact) == data


def test_soft_delete_then_purge_removes_the_file_and_the_record(storage):
    result = artifact_tasks.save_report.enqueue("del")
    drain()
    artifact = artifacts.find(result.id, "report.txt")
    assert artifacts.delete(artifact)
    assert not artifacts.delete(artifact)  # once
    assert artifacts.find(result.id, "report.txt") is None
    with pytest.raises(Artifact.DoesNotExist):
        artifacts.get(artifact.pk)
    assert artifacts.get_record(artifact.pk).deleted_at is not None
    assert sweep().purged == 0  # within the grace period
    assert storage.exists(artifact.name)
    age(artifact, deleted_at=GRACE + 60)
    assert sweep().purged == 1
    assert not storage.exists(artifact.name)
    assert not Artifact.objects.filter(pk=artifact.pk).exists()
    assert not ArtifactLink.objects.filter(artifact_id=artifact.pk).exists()


def test_owner_purged_sweeps_ephemeral_and_keeps_durable(storage, tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"x")
    ephemeral = artifact_tasks.save_file.enqueue(str(path))
    durable = artifact_tasks.save_file.enqueue(str(path), durable=True)
    drain()
    kept = artifacts.find(durable.id, "data.bin")
    swept = artifacts.find(ephemeral.id, "data.bin")
    assert kept.lifecycle == "durable" and swept.lifecycle == "ephemeral"
    assert sweep().busy is False  # owners alive: nothing to do
    Job.objects.filter(pk__in=[ephemeral.id, durable.id]).delete()  # as retention does
    counts = sweep()
    assert counts.owner_gone == 1
    assert artifacts.get_record(swept.pk).deleted_at is not None
    assert artifacts.get(kept.pk) == kept
    age(swept, deleted_at=GRACE + 60)
    age(kept, created_at=GRACE * 48)
    assert sweep().purged == 1
    assert not storage.exists(swept.name)
    assert storage.exists(kept.name)
    assert artifacts.get(kept.pk) == kept  # durable: never swept without an expiry


def test_orphans_are_swept_after_the_cutoff(storage):
    orphan = artifact_store.artifact_create(storage="artifacts", name="dispatch/orphan.bin")
    storage.save(orphan.name, io.BytesIO(b"left behind"))
    durable = artifact_store.artifact_create(
        storage="artifacts", name="dispatch/kept.bin", lifecycle="durable"
    )
    assert sweep().orphans == 0  # younger than the cutoff: maybe still being written
    age(orphan, created_at=GRACE + 60)
    age(durable, created_at=GRACE + 60)
    assert sweep().orphans == 1
    age(orphan, deleted_at=GRACE + 60)
    assert sweep().purged == 1
    assert not storage.exists("dispatch/orphan.bin")
    assert artifacts.get(durable.pk)


def test_expiry_soft_deletes_durable_and_ephemeral_artifacts(storage):
    soon = artifact_store.artifact_create(
        storage="artifacts", name="dispatch/soon.bin", lifecycle="durable", expires_in=3600
    )
    later = artifact_store.artifact_create(
        storage="artifacts", name="dispatch/later.bin", expires_in=7200
    )
    assert sweep().expired == 0
    Artifact.objects.filter(pk=soon.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert sweep().expired == 1
    assert artifacts.get_record(soon.pk).deleted_at is not None
    assert artifacts.get(later.pk)
    updated = artifacts.update(later, expires_in=0)
    assert updated.expires_at is not None
    assert sweep().expired == 1


def test_an_artifact_expiring_now_is_swept_now(storage):
    """``expires_in=0`` means expired at once, even within the clock's tick.

    SQLite's clock ticks in milliseconds, so the update and the sweep often
    read the same instant; a sweep asking ``expires_at < now`` skipped it.
    """
    for round_ in range(30):
        artifact = artifact_store.artifact_create(
            storage="artifacts", name=f"dispatch/now-{round_}.bin", expires_in=3600
        )
        artifact_store.artifact_update(artifact.pk, expires_in=0)
        assert artifact_store.artifacts_sweep_expired(batch=10) == 1, f"round {round_}"


def test_update_changes_only_metadata(storage):
    artifact = artifact_store.artifact_create(storage="artifacts", name="dispatch/u.bin")
    updated = artifacts.update(artifact, size=3, sha256="a" * 64, content_type="text/csv")
    assert (updated.size, updated.sha256, updated.content_type) == (3, "a" * 64, "text/csv")
    with pytest.raises(ValueError, match="only"):
        artifact_store.artifact_update(artifact.pk, name="elsewhere")
    with pytest.raises(ValueError, match="0 or more"):
        artifacts.update(artifact, size=-1)
    artifacts.delete(artifact)
    with pytest.raises(Artifact.DoesNotExist):
        artifacts.update(artifact, size=4)


def test_paged_listing_newest_first_with_filters(storage):
    made = [
        artifact_store.artifact_create(
            storage="artifacts",
            name=f"dispatch/p{i}.bin",
            content_type="text/csv" if i % 2 else "image/png",
        )
        for i in range(5)
    ]
    first = artifacts.page(limit=2)
    assert [a.pk for a in first.items] == [made[4].pk, made[3].pk]
    second = artifacts.page(limit=2, before=first.next_before)
    assert [a.pk for a in second.items] == [made[2].pk, made[1].pk]
    last = artifacts.page(limit=2, before=second.next_before)
    assert [a.pk for a in last.items] == [made[0].pk] and last.next_before is None
    csv = artifacts.page(content_type="text/csv")
    assert [a.pk for a in csv.items] == [made[3].pk, made[1].pk]
    artifacts.delete(made[4])
    assert made[4].pk not in [a.pk for a in artifacts.page().items]
    assert made[4].pk in [a.pk for a in artifacts.page(include_deleted=True).items]


def test_linking_is_idempotent_and_one_attempt_cannot_link_two_files(storage):
    a = artifact_store.artifact_create(storage="artifacts", name="dispatch/a.bin")
    b = artifact_store.artifact_create(storage="artifacts", name="dispatch/b.bin")
    spec = artifact_store.LinkSpec("run", 7, "out", 1)
    first = artifact_store.artifact_link(a.pk, spec)
    assert artifact_store.artifact_link(a.pk, spec) == first
    with pytest.raises(ArtifactExists, match="attempt 1"):
        artifact_store.artifact_link(b.pk, spec)
    assert artifact_store.artifact_link(b.pk, artifact_store.LinkSpec("run", 7, "out", 2))
    assert ArtifactLink.objects.count() == 2


def test_a_live_storage_name_is_taken_once_and_freed_by_deletion(storage):
    first = artifact_store.artifact_create(storage="artifacts", name="dispatch/same.bin")
    with pytest.raises(ArtifactExists, match="already holds"):
        artifact_store.artifact_create(storage="artifacts", name="dispatch/same.bin")
    artifacts.delete(first)
    again = artifact_store.artifact_create(storage="artifacts", name="dispatch/same.bin")
    assert again.pk != first.pk


def _claimed_context(result_id, worker):
    (claimed,) = store.jobs_claim(worker_id=worker, queues=[], limit=1, lease_seconds=30)
    assert claimed.id == int(result_id)
    task_result = artifact_tasks.save_report.get_result(result_id)
    return DispatchTaskContext(task_result=task_result, lease=claimed.lease, lease_seconds=30)


def test_a_stale_attempt_cannot_link_and_its_file_is_swept_later(storage):
    result = artifact_tasks.save_report.enqueue("stale")
    stale = _claimed_context(result.id, "w1")
    # w1 stops heartbeating; its lease expires, the job goes back and w2 takes it.
    Job.objects.filter(pk=result.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert store.jobs_rescue_expired(max_worker_lost=3)[0] == [int(result.id)]
    current = _claimed_context(result.id, "w2")

    with pytest.raises(JobCancelled):
        stale.save_artifact("report.txt", b"from the stale attempt")
    assert stale.cancelled
    won = current.save_artifact("report.txt", b"from the current attempt")
    assert artifacts.find(result.id, "report.txt") == won
    assert read(won) == b"from the current attempt"

    (orphan,) = Artifact.objects.filter(links__isnull=True)
    assert storage.exists(orphan.name) and read(orphan) == b"from the stale attempt"
    age(orphan, created_at=GRACE + 60)
    assert sweep().orphans == 1
    age(orphan, deleted_at=GRACE + 60)
    assert sweep().purged == 1
    assert not storage.exists(orphan.name)
    assert artifacts.get(won.pk) == won


@pytest.mark.parametrize(
    ("name", "content", "options", "error", "match"),
    [
        ("", b"x", {}, ValueError, "1 to 200"),
        ("n" * 201, b"x", {}, ValueError, "1 to 200"),
        ("../escape", b"x", {}, ValueError, "relative"),
        ("/abs", b"x", {}, ValueError, "relative"),
        (7, b"x", {}, TypeError, "string"),
        ("a.txt", "text", {}, TypeError, "encode"),
        ("a.txt", 42, {}, TypeError, "bytes"),
        ("a.txt", io.StringIO("t"), {}, TypeError, "binary"),
        ("a.txt", b"x", {"expires_in": -1}, ValueError, "0 or more"),
        ("a.txt", b"x", {"expires_in": "1"}, TypeError, "seconds"),
    ],
)
def test_bad_input_writes_nothing(storage, name, content, options, error, match):
    result = artifact_tasks.save_report.enqueue("bad")
    context = _claimed_context(result.id, "w1")
    with pytest.raises(error, match=match):
        context.save_artifact(name, content, **options)
    assert not Artifact.objects.exists()
    assert not storage.exists("dispatch")  # no file, no directory


def test_an_unknown_storage_alias_writes_nothing(storage, settings):
    settings.DISPATCH = {**settings.DISPATCH, "ARTIFACT_STORAGE": "nowhere"}
    result = artifact_tasks.save_report.enqueue("alias")
    context = _claimed_context(result.id, "w1")
    with pytest.raises(ImproperlyConfigured, match=r"'nowhere'.*STORAGES"):
        context.save_artifact("a.txt", b"x")
    assert not Artifact.objects.exists()


def test_the_system_check_names_an_unknown_alias(settings):
    from django_dispatch.checks import check_artifact_storage

    assert check_artifact_storage() == []
    settings.STORAGES = {"staticfiles": settings.STORAGES["staticfiles"]}
    assert check_artifact_storage() == []  # not set: a site that saves nothing is not refused
    settings.DISPATCH = {**settings.DISPATCH, "ARTIFACT_STORAGE": "default"}
    assert check_artifact_storage()[0].id == "django_dispatch.E050"
    settings.DISPATCH = {**settings.DISPATCH, "ARTIFACT_STORAGE": "nowhere"}
    (error,) = check_artifact_storage()
    assert error.id == "django_dispatch.E050" and "'nowhere'" in error.msg


def test_a_workflow_step_saves_an_export_the_next_step_reads(storage):
    run = artifact_tasks.exports.start({})
    drain()
    run.refresh_from_db()
    assert run.state == "succeeded", run
    export_step = run.steps.get(name="export")
    artifact = artifacts.find(export_step, "export.csv")
    assert artifact.content_type == "text/csv"
    assert read(artifact) == b"id,name\n1,ada\n"
    assert run.steps.get(name="consume").output == {"lines": 2}
    link = artifacts.links(export_step).get()
    assert (link.owner_kind, link.generation, link.attempt) == ("step", 1, 1)


def test_a_replayed_step_gets_a_new_attempt_and_find_returns_the_newest(storage):
    from django_dispatch.workflows import replay_run

    run = artifact_tasks.exports.start({})
    drain()
    export_step = run.steps.get(name="export")
    first = artifacts.find(export_step, "export.csv")
    replay_run(run.pk, "export")
    drain()
    newest = artifacts.find(export_step, "export.csv")
    assert newest.pk != first.pk
    assert [a.pk for a in artifacts.for_owner(export_step)] == [newest.pk, first.pk]
    assert [(link.generation, link.attempt) for link in artifacts.links(export_step)] == [
        (2, 1),
        (1, 1),
    ]


def test_a_replayed_job_has_its_own_artifacts_and_the_old_ones_stay(storage):
    from django_dispatch import replay
    from django_dispatch.models import DeadLetter

    result = artifact_tasks.save_report.using().enqueue("replay", fail_until=3)
    drain()
    assert Job.objects.get(pk=result.id).state == "failed"
    letter = DeadLetter.objects.get(job_id=result.id)
    again = replay(letter.pk, args=["replay"], kwargs={"fail_until": 0})
    drain()
    assert read(artifacts.find(again.id, "report.txt")) == b"replay attempt 1"
    assert read(artifacts.find(result.id, "report.txt")) == b"replay attempt 3"
    assert len(artifacts.for_owner(result.id)) == 3


def test_the_leader_runs_the_lifecycle_and_other_workers_do_not(storage):
    from dataclasses import replace

    from django_dispatch.conf import get_settings
    from django_dispatch.runtime.maintenance import Maintenance

    orphan = artifact_store.artifact_create(storage="artifacts", name="dispatch/leader.bin")
    storage.save(orphan.name, io.BytesIO(b"x"))
    age(orphan, created_at=120)
    cfg = replace(get_settings(), ARTIFACT_ORPHAN_SECONDS=60.0, ARTIFACT_PURGE_GRACE=60.0)
    maintenance = Maintenance("w1", cfg, db="default")
    assert maintenance.sweep_artifacts in [d.run for d in maintenance.duties(cron=False)]
    maintenance.sweep_artifacts()  # not the leader: nothing
    assert artifacts.get(orphan.pk)
    maintenance.leader = True
    maintenance.sweep_artifacts()
    assert artifacts.get_record(orphan.pk).deleted_at is not None
    age(orphan, deleted_at=120)
    maintenance.sweep_artifacts()
    assert not Artifact.objects.filter(pk=orphan.pk).exists()
    assert not storage.exists(orphan.name)


def test_a_storage_that_reads_out_of_order_gets_the_hash_of_what_it_stored(settings, tmp_path):
    import hashlib

    settings.STORAGES = {
        **settings.STORAGES,
        "odd": {
            "BACKEND": "tests.artifact_storages.OutOfOrderStorage",
            "OPTIONS": {"location": str(tmp_path / "odd")},
        },
    }
    settings.DISPATCH = {**settings.DISPATCH, "ARTIFACT_STORAGE": "odd"}
    result = artifact_tasks.save_report.enqueue("odd order")
    drain()
    artifact = artifacts.find(result.id, "report.txt")
    assert read(artifact) == b"odd order attempt 1"
    assert artifact.size == len(b"odd order attempt 1")
    assert artifact.sha256 == hashlib.sha256(b"odd order attempt 1").hexdigest()


def test_a_job_handed_back_reruns_its_attempt_and_takes_over_the_name(storage):
    result = artifact_tasks.save_report.enqueue("handback")
    first = _claimed_context(result.id, "w1")
    before = first.save_artifact("report.txt", b"first claim")
    with pytest.raises(ArtifactExists, match="already saved"):
        first.save_artifact("report.txt", b"again in the same claim")
    assert Artifact.objects.count() == 1  # refused before anything was written
    # Graceful shutdown: handed back without spending the attempt.
    assert store.job_release_if_leased(first.lease, attempts=0, worker_ids=[])
    second = _claimed_context(result.id, "w2")
    assert second.task_result.attempts == 1  # the same attempt number again
    after = second.save_artifact("report.txt", b"second claim")
    assert artifacts.find(result.id, "report.txt") == after
    assert [a.pk for a in artifacts.for_owner(result.id)] == [after.pk]
    assert not ArtifactLink.objects.filter(artifact_id=before.pk).exists()  # an orphan now
    age(before, created_at=GRACE + 60)
    assert sweep().orphans == 1  # the first claim's, now unlinked


def test_run_links_and_owner_gone_for_runs_and_steps(storage):
    run = artifact_tasks.exports.start({})
    drain()
    export_step = run.steps.get(name="export")
    export = artifacts.find(export_step, "export.csv")
    final = artifacts.link(run, export, "final.csv", role="output")
    assert artifacts.link(run, export.pk, "final.csv", role="output") == final  # idempotent
    assert artifacts.for_owner(run) == [export]
    assert artifacts.for_owner(run, role="input") == []
    with pytest.raises(ValueError, match="role"):
        artifacts.link(run, export, "x.csv", role="bogus")
    assert sweep().busy is False
    run.delete()  # its steps go with it (as workflow retention does)
    assert sweep().owner_gone == 1
    assert artifacts.get_record(export.pk).deleted_at is not None


@pytest.mark.parametrize("second_owner", ["run", "step", "job"])
def test_an_artifact_another_live_owner_links_outlives_its_purged_job(storage, second_owner):
    """A run's final output (or a step's, or another job's input) is a job's
    artifact: the job is purged after JOB_RETENTION, the run lives on for
    WORKFLOW_RETENTION. The sweep keeps the artifact while one owner lives."""
    made = artifact_tasks.save_report.enqueue("kept")
    drain()
    report = artifacts.find(made.id, "report.txt")
    if second_owner == "job":
        owner = Job.objects.get(pk=artifact_tasks.save_report.enqueue("user").id)
        drain()
        role = "input"
    else:
        owner = artifact_tasks.exports.start({})
        drain()
        role = "output"
        if second_owner == "step":
            owner, role = owner.steps.get(name="consume"), "input"
    artifacts.link(owner, report, "final.txt", role=role)
    Job.objects.filter(pk=made.id).delete()  # purged by retention, its link left behind
    assert sweep().owner_gone == 0
    assert artifacts.get(report.pk) == report  # still live: its other owner exists
    age(report, created_at=GRACE * 48)
    assert sweep().busy is False  # nor is it an orphan: it has links
    assert storage.exists(report.name)
    if second_owner == "step":
        WorkflowRun.objects.filter(pk=owner.run_id).delete()  # the step goes with its run
    else:
        owner.delete()  # the last owner goes too
    sweep()
    assert artifacts.get_record(report.pk).deleted_at is not None
    assert ArtifactLink.objects.filter(artifact_id=report.pk).count() == 2  # kept till the purge
    with pytest.raises(Artifact.DoesNotExist):  # too late to keep it by linking it
        artifact_store.artifact_link(report.pk, artifact_store.LinkSpec("run", 7, "late.txt", 0))
    assert ArtifactLink.objects.filter(artifact_id=report.pk).count() == 2


def test_the_owner_sweep_reads_all_links_of_a_candidate_in_pages(storage):
    """An input shared by many jobs, all purged but the newest: more links than
    a page (batch 1: windows and pages of 10 links). The sweep reads them all
    before deciding, and keeps the artifact until its last owner is gone."""
    newest = artifact_tasks.save_report.enqueue("pages")  # queued: alive
    shared = artifact_store.artifact_create(storage="artifacts", name="dispatch/shared.bin")
    owners = [10**12 + i for i in range(15)] + [int(newest.id)]  # 15 gone, then a live one
    for owner in owners:
        spec = artifact_store.LinkSpec("job", owner, "shared.bin", 0, role="input")
        artifact_store.artifact_link(shared.pk, spec)
    cursor = None
    for _ in range(2):  # 16 links: two windows of 10, each making it a candidate
        counts = sweep(batch=1, cursor=cursor)
        assert counts.owner_gone == 0
        cursor = counts.cursor
    assert cursor == artifact_store.SweepCursor()
    assert artifacts.get(shared.pk) == shared
    Job.objects.filter(pk=newest.id).delete()
    assert sweep(batch=1).owner_gone == 1
    assert artifacts.get_record(shared.pk).deleted_at is not None


class GeneratedStream(io.RawIOBase):
    """A non-seekable stream of ``total`` bytes made on the fly, as a pipe or an
    HTTP body gives them; refuses unbounded reads and records the largest read."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.largest = 0
        self.hasher = __import__("hashlib").sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        assert size is not None and size >= 0, "read everything at once: not streamed"
        self.largest = max(self.largest, size)
        chunk = bytes((self.left + i) % 251 for i in range(min(size, self.left)))
        self.left -= len(chunk)
        self.hasher.update(chunk)
        return chunk


def test_a_non_seekable_stream_is_saved_in_chunks(storage):
    result = artifact_tasks.save_report.enqueue("stream")
    context = _claimed_context(result.id, "w1")
    stream = GeneratedStream(3 * 1024 * 1024 + 7)
    artifact = context.save_artifact("big.bin", stream)
    assert stream.left == 0 and stream.largest <= 1024 * 1024  # bounded chunks
    assert artifact.size == 3 * 1024 * 1024 + 7
    assert artifact.sha256 == stream.hasher.hexdigest()
    with artifacts.open(artifact) as f:
        assert __import__("hashlib").sha256(f.read()).hexdigest() == artifact.sha256


def test_an_async_task_saves_through_asave_artifact(storage):
    result = artifact_tasks.save_async.enqueue("from a coroutine")
    drain()
    artifact = artifacts.find(result.id, "async.txt")
    assert Job.objects.get(pk=result.id).return_value == artifact.pk
    assert read(artifact) == b"from a coroutine"


def test_sweeps_stay_in_their_namespace(storage):
    theirs = artifact_store.artifact_create(
        storage="artifacts", name="dispatch/acme/o.bin", namespace="acme"
    )
    age(theirs, created_at=GRACE + 60)
    assert sweep().orphans == 0  # the default namespace's leader leaves it alone
    assert sweep(namespace="acme").orphans == 1


def test_owner_and_orphan_sweeps_walk_big_tables_in_windows(storage):
    result = artifact_tasks.save_report.enqueue("windows")
    made = [
        artifact_store.artifact_create(storage="artifacts", name=f"dispatch/w{i}.bin")
        for i in range(25)
    ]
    for i, artifact in enumerate(made[:-1]):  # the last one stays an orphan
        owner = 10**12 if i == 22 else int(result.id)  # link 22's owner is gone
        artifact_store.artifact_link(artifact.pk, artifact_store.LinkSpec("job", owner, f"n{i}", 1))
        age(artifact, created_at=GRACE + 60)
    age(made[-1], created_at=GRACE + 60)
    cursor = None
    rounds = []
    for _ in range(3):  # windows of 10 rows (batch 1): the whole table in 3 rounds
        counts = sweep(batch=1, cursor=cursor)
        rounds.append((counts.owner_gone, counts.orphans))
        cursor = counts.cursor
    assert rounds == [(0, 0), (0, 0), (1, 1)]
    assert cursor == artifact_store.SweepCursor()  # the end: start over next time
    assert artifacts.get_record(made[22].pk).deleted_at is not None
    assert artifacts.get_record(made[24].pk).deleted_at is not None
    assert Artifact.objects.filter(deleted_at=None).count() == 23


def test_a_step_attempt_that_lost_its_claim_cannot_link(storage):
    from django_dispatch.workflows.context import StepContext
    from django_dispatch.workflows.exceptions import StepLost

    run = artifact_tasks.exports.start({})
    step = run.steps.get(name="export")  # ready: no attempt holds it
    stale = StepContext(
        run_id=run.pk,
        step="export",
        input={},
        outputs={},
        attempt=1,
        generation=1,
        step_id=step.pk,
        claim_id="a-void-claim",
    )
    with pytest.raises(StepLost):
        stale.save_artifact("export.csv", b"stale")
    assert stale.cancelled
    (orphan,) = Artifact.objects.all()
    assert not orphan.links.exists() and read(orphan) == b"stale"
    assert orphan.name.startswith(f"dispatch/_default/step/{step.pk}/g1a1/")
    assert artifacts.find(step, "export.csv") is None
