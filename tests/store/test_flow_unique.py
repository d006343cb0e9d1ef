"""unique_for (issue #17, item 4): an idempotency key also dedupes against jobs
of that key that finished within the window."""

from __future__ import annotations

import time

import pytest

from django_dispatch.compat import InvalidTask, TaskResultStatus
from django_dispatch.models import Job
from django_dispatch.testing import drain
from tests.concurrency import run_concurrently
from tests.conftest import postgres_only
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def keyed(key="k", window=3600):
    return tasks.add.using(idempotency_key=key, unique_for=window)


def test_within_the_window_the_finished_job_is_returned():
    first = keyed().enqueue(1, 2)
    drain()
    again = keyed().enqueue(5, 5)
    assert again.id == first.id
    assert again.status == TaskResultStatus.SUCCESSFUL and again.return_value == 3
    assert Job.objects.count() == 1


def test_after_the_window_a_new_job():
    first = keyed(window=0.5).enqueue(1, 2)
    drain()
    time.sleep(0.6)
    second = keyed(window=0.5).enqueue(1, 2)
    assert second.id != first.id
    assert Job.objects.count() == 2


def test_without_unique_for_the_key_is_free_once_finished():
    first = tasks.add.using(idempotency_key="k").enqueue(1, 2)
    drain()
    assert tasks.add.using(idempotency_key="k").enqueue(1, 2).id != first.id


def test_a_live_job_is_still_returned():
    first = keyed().enqueue(1, 2)
    assert keyed().enqueue(1, 2).id == first.id


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: tasks.add.using(unique_for=60), "needs an idempotency_key"),
        (lambda: keyed(window=0), "positive number"),
        (lambda: keyed(window="1h"), "positive number"),
    ],
)
def test_bad_unique_for_is_refused_and_nothing_written(make, message):
    with pytest.raises(InvalidTask, match=message):
        make().enqueue(1, 2)
    assert not Job.objects.exists()


@postgres_only
@pytest.mark.parametrize("finished_first", [False, True])
def test_eight_concurrent_enqueues_give_one_job(finished_first):
    old = None
    if finished_first:
        old = keyed().enqueue(0, 0)
        drain()
    ids = run_concurrently(*[lambda: keyed().enqueue(1, 1).id] * 8, together=True)
    assert len(set(ids)) == 1
    assert Job.objects.count() == 1
    if old is not None:
        assert ids[0] == old.id


@postgres_only
def test_an_enqueue_racing_the_finish_of_the_holder_returns_it():
    """The enqueue's INSERT waits on the unique index while the holder's finish
    is uncommitted, and succeeds once it commits; the check after the insert
    then finds the job that just finished and undoes the insert."""
    from django.db import transaction

    from django_dispatch import store

    live = keyed().enqueue(1, 2)
    [claimed] = store.jobs_claim(worker_id="w", queues=(), limit=1, lease_seconds=30)

    def finish_slowly():
        with transaction.atomic():
            assert store.job_finish_if_leased(claimed.lease, 3)
            time.sleep(0.6)

    def enqueue_meanwhile():
        time.sleep(0.2)
        return keyed().enqueue(9, 9).id

    _, got = run_concurrently(finish_slowly, enqueue_meanwhile)
    assert got == live.id
    assert Job.objects.count() == 1
