"""Dead letters, replay and retention, on the real database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from django_dispatch import AlreadyReplayed, replay, store
from django_dispatch.core.states import JobState
from django_dispatch.exceptions import InvalidTaskArguments
from django_dispatch.models import DeadLetter, Job
from django_dispatch.services import purge
from django_dispatch.testing import drain
from tests.concurrency import run_concurrently
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def failed_for_good(message="boom", **using):
    enqueued = tasks.fail_always.using(**using).enqueue(message)
    drain()
    return enqueued, DeadLetter.objects.get(job_id=enqueued.id)


def test_a_job_failed_for_good_gets_its_dead_letter():
    enqueued, letter = failed_for_good("kaput", partition_key="acct:1")
    job = Job.objects.get(pk=enqueued.id)
    assert job.state == JobState.FAILED
    assert letter.task_path == "tests.testapp.tasks.fail_always"
    assert (letter.args, letter.kwargs, letter.partition_key) == (["kaput"], {}, "acct:1")
    assert letter.error_class == "builtins.ValueError" and letter.error_message == "kaput"
    assert "Traceback" in letter.errors[0]["traceback"]
    assert letter.worker_ids == job.worker_ids and letter.enqueued_at == job.enqueued_at
    assert letter.failed_at >= job.enqueued_at and letter.replayed_at is None


def test_retries_do_not_create_dead_letters_until_the_last():
    enqueued = tasks.fail_twice.enqueue("dl")
    drain()
    assert tasks.fail_twice.get_result(enqueued.id).status == "SUCCESSFUL"
    assert not DeadLetter.objects.exists()


def test_a_job_that_keeps_killing_workers_is_dead_lettered():
    enqueued = tasks.add.enqueue(1, 1)
    for n in range(3):
        store.jobs_claim(worker_id=f"w{n}", queues=(), limit=1, lease_seconds=30)
        Job.objects.filter(pk=enqueued.id).update(lease_expires_at=timezone.now() - timedelta(1))
        store.jobs_rescue_expired(max_worker_lost=3)
    letter = DeadLetter.objects.get(job_id=enqueued.id)
    assert letter.error_class == "django_dispatch.exceptions.WorkerLost"
    assert len(letter.errors) == 3


def test_replay_enqueues_a_fresh_job_and_records_the_history():
    enqueued, letter = failed_for_good("first", partition_key="acct:7")
    result = replay(letter.pk, replayed_by="ada")
    new = Job.objects.get(pk=result.id)
    assert new.pk != int(enqueued.id) and new.state == JobState.PENDING
    assert (new.args, new.partition_key, new.attempts, new.errors) == (["first"], "acct:7", 0, [])
    letter.refresh_from_db()
    assert letter.replay_job_id == new.pk and letter.replayed_by == "ada"
    assert letter.replayed_at is not None and letter.replay_args == ["first"]
    with pytest.raises(AlreadyReplayed):
        replay(letter.pk)
    assert Job.objects.count() == 2


def test_replay_with_corrected_arguments():
    _, letter = failed_for_good("bad input")
    result = replay(letter.pk, args=["fixed input"], replayed_by="ops")
    assert result.args == ["fixed input"]
    letter.refresh_from_db()
    assert letter.replay_args == ["fixed input"] and letter.args == ["bad input"]


def test_a_replay_that_cannot_enqueue_releases_its_claim():
    _, letter = failed_for_good()
    with pytest.raises(InvalidTaskArguments):
        replay(letter.pk, args=[1, 2, 3])  # does not fit fail_always(message)
    letter.refresh_from_db()
    assert letter.replayed_at is None and letter.replay_job_id is None
    replay(letter.pk, args=["ok now"])  # can be replayed later
    assert DeadLetter.objects.get(pk=letter.pk).replay_job_id is not None


def test_two_concurrent_replays_enqueue_one_job():
    _, letter = failed_for_good()

    def attempt() -> str:
        try:
            replay(letter.pk)
            return "won"
        except AlreadyReplayed:
            return "lost"

    outcomes = run_concurrently(attempt, attempt, together=True)
    assert sorted(outcomes) == ["lost", "won"]
    assert Job.objects.count() == 2  # the failed one and exactly one replay


def test_unknown_dead_letter():
    with pytest.raises(DeadLetter.DoesNotExist):
        replay(123456)


# --- retention ---------------------------------------------------------------------


def _age(queryset, days):
    queryset.update(finished_at=timezone.now() - timedelta(days=days))


@override_settings(
    DISPATCH={
        "JOB_RETENTION": {"succeeded": 86400, "failed": None},
        "DEAD_LETTER_RETENTION": 86400,
        "PURGE_BATCH": 2,
    }
)
def test_purge_respects_retention_per_state_and_runs_in_batches():
    for i in range(5):
        tasks.add.enqueue(i, i)
    drain()
    _, letter = failed_for_good()
    live = tasks.add.enqueue(9, 9)
    _age(Job.objects.filter(state__in=[JobState.SUCCEEDED, JobState.FAILED]), 3)
    DeadLetter.objects.update(failed_at=timezone.now() - timedelta(days=3))

    # one bounded batch deletes at most PURGE_BATCH rows per state
    assert store.jobs_purge({"succeeded": 86400}, batch=2) == 2
    jobs, letters = purge()
    assert (jobs, letters) == (3, 1)
    assert not Job.objects.filter(state=JobState.SUCCEEDED).exists()
    assert Job.objects.filter(state=JobState.FAILED).exists()  # None keeps forever
    assert Job.objects.filter(pk=live.id).exists()  # live jobs are never purged
    assert not DeadLetter.objects.filter(pk=letter.pk).exists()


def test_purge_leaves_recent_jobs_alone():
    tasks.add.enqueue(1, 1)
    drain()
    assert purge() == (0, 0)
    assert Job.objects.count() == 1
