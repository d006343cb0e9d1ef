"""The ``scheduled`` state: deferred jobs and retries backing off wait out of the
claim index; the stager (store/staging.py) makes them pending when due."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dispatch import enqueue_many, store
from django_dispatch.compat import TaskResultStatus
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.store.claim_by_id import job_claim_by_id
from django_dispatch.store.staging import jobs_stage_due
from tests.conftest import postgres_only
from tests.store.helpers import claim
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

LATER = timedelta(hours=1)


def _state(job_id) -> str:
    return Job.objects.get(pk=job_id).state


def _make_due(*job_ids) -> None:
    """As if their time had come: run_after in the past (the stager's clock is the
    database's, so the row moves rather than the clock)."""
    Job.objects.filter(pk__in=job_ids).update(run_after=timezone.now() - timedelta(seconds=1))


def test_a_deferred_enqueue_is_scheduled_and_an_immediate_one_pending():
    later = timezone.now() + LATER
    deferred = tasks.add.using(run_after=later).enqueue(1, 1)  # the raw INSERT on PostgreSQL
    keyed = tasks.add.using(run_after=later, partition_key="k").enqueue(1, 2)  # the ORM path
    (many,) = enqueue_many(tasks.add.using(run_after=later), [((1, 3), {})])  # ids
    now = tasks.add.enqueue(1, 4)
    past = tasks.add.using(run_after=timezone.now() - LATER).enqueue(1, 5)
    for job_id in (deferred.id, keyed.id, many):
        assert _state(job_id) == JobState.SCHEDULED
        # Django's view of it: still READY, as any job waiting to run.
        assert tasks.add.get_result(job_id).status == TaskResultStatus.READY
    assert _state(now.id) == JobState.PENDING and _state(past.id) == JobState.PENDING
    assert [c.id for c in claim()] == [int(past.id), int(now.id)]  # nothing deferred


def test_the_stager_makes_due_jobs_pending_earliest_first_in_bounded_batches():
    later = timezone.now() + LATER
    results = enqueue_many(tasks.add.using(run_after=later), [((i, i), {}) for i in range(7)])
    ids = [int(r) for r in results]
    not_yet = tasks.add.using(run_after=later).enqueue(9, 9)
    _make_due(*ids)
    # Earliest due first: the last three became due first.
    Job.objects.filter(pk__in=ids[4:]).update(run_after=timezone.now() - LATER)
    assert jobs_stage_due(limit=3) == 3
    assert {j for j in ids if _state(j) == JobState.PENDING} == set(ids[4:])
    assert jobs_stage_due(limit=3) == 3
    assert jobs_stage_due(limit=3) == 1
    assert jobs_stage_due(limit=3) == 0
    assert all(_state(j) == JobState.PENDING for j in ids)
    assert _state(not_yet.id) == JobState.SCHEDULED  # not due: left alone
    assert jobs_stage_due(namespace="elsewhere") == 0


def test_a_claim_stages_what_came_due_and_runs_it_in_the_same_claim():
    deferred = tasks.add.using(run_after=timezone.now() + LATER).enqueue(1, 1)
    assert claim() == []
    _make_due(deferred.id)
    assert [c.id for c in claim()] == [int(deferred.id)]
    assert store.jobs_claim(worker_id="w", queues=(), limit=5, lease_seconds=30, stage=0) == []


def test_burst_sees_a_due_job_not_staged_yet():
    deferred = tasks.add.using(run_after=timezone.now() + LATER).enqueue(1, 1)
    assert not store.jobs_due_exist(queues=())
    _make_due(deferred.id)
    assert store.jobs_due_exist(queues=())
    assert not store.jobs_due_exist(queues=["emails"])  # another queue's worker


def test_a_retry_backing_off_is_scheduled_and_one_due_at_once_pending():
    first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(1, 2)
    a, b = claim(limit=2)
    assert store.job_fail_if_leased(a.lease, [], 60.0)
    assert store.job_fail_if_leased(b.lease, [], 0.0)
    assert _state(first.id) == JobState.SCHEDULED
    assert _state(second.id) == JobState.PENDING
    assert tasks.add.get_result(first.id).status == TaskResultStatus.READY
    # retry_now: the backoff is over at once.
    assert store.jobs_retry_now(job_ids=[int(first.id)]) == 1
    assert _state(first.id) == JobState.PENDING


def test_a_scheduled_job_can_be_cancelled():
    deferred = tasks.add.using(run_after=timezone.now() + LATER).enqueue(1, 1)
    assert store.job_cancel(int(deferred.id))
    assert _state(deferred.id) == JobState.CANCELLED
    _make_due(deferred.id)
    assert jobs_stage_due() == 0 and claim() == []


def test_run_now_claims_a_scheduled_job_and_a_hand_back_schedules_it_again():
    deferred = tasks.add.using(run_after=timezone.now() + LATER).enqueue(1, 1)
    claimed = job_claim_by_id(int(deferred.id), worker_id="inline", lease_seconds=30)
    assert claimed is not None and _state(deferred.id) == JobState.RUNNING
    # Handed back before it ran: it waits for its time again, out of the claim index.
    assert store.job_release_if_leased(claimed.lease, attempts=0, worker_ids=[])
    assert _state(deferred.id) == JobState.SCHEDULED


def test_a_deferred_job_keeps_its_place_in_its_partition():
    """FIFO by enqueue order: a job of the key enqueued after a deferred one waits
    for it, whether that one is scheduled, due, or running."""
    first = tasks.add.using(partition_key="k", run_after=timezone.now() + LATER).enqueue(1, 1)
    second = tasks.add.using(partition_key="k").enqueue(1, 2)
    other = tasks.add.using(partition_key="other").enqueue(1, 3)
    assert [c.id for c in claim()] == [int(other.id)]  # second waits behind the deferred head
    assert _state(second.id) == JobState.BLOCKED
    assert store.partitions_promote_stalled("default") == 0  # its head is scheduled: not stalled
    _make_due(first.id)
    (head,) = claim()
    assert head.id == int(first.id)
    assert claim() == []  # the head runs: second still waits
    assert store.job_finish_if_leased(head.lease, None)
    assert [c.id for c in claim()] == [int(second.id)]


def test_cancelling_a_scheduled_head_lets_its_partition_go_on():
    first = tasks.add.using(partition_key="k", run_after=timezone.now() + LATER).enqueue(1, 1)
    second = tasks.add.using(partition_key="k").enqueue(1, 2)
    assert claim() == [] and _state(second.id) == JobState.BLOCKED
    assert store.job_cancel(int(first.id))
    assert [c.id for c in claim()] == [int(second.id)]


def test_live_counts_and_lists_know_scheduled_jobs():
    from django_dispatch.queries.lists import jobs_count, jobs_list
    from django_dispatch.queries.status import snapshot
    from django_dispatch.store.base import live_jobs

    tasks.add.using(run_after=timezone.now() + LATER).enqueue(1, 1)
    tasks.add.enqueue(1, 2)
    (queue,) = snapshot().queues
    assert (queue.pending, queue.scheduled) == (1, 1)
    listed = jobs_list(state="scheduled")
    assert [j.state for j in listed] == [JobState.SCHEDULED]
    assert jobs_count(state="scheduled") == 1
    assert Job.objects.filter(live_jobs()).count() == 2


@postgres_only
def test_staging_notifies_idle_workers_of_the_namespace():
    """The insert trigger NOTIFYs on INSERT only; a job that becomes due must
    still wake idle workers: the stager NOTIFYs when it staged anything."""
    import psycopg

    from django_dispatch.store.base import notify_channel

    deferred = tasks.add.using(run_after=timezone.now() + LATER).enqueue(1, 1)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute(f'LISTEN "{notify_channel("")}"')
        assert jobs_stage_due() == 0
        assert list(listener.notifies(timeout=0.3)) == []  # nothing staged: no wake-up
        _make_due(deferred.id)
        assert jobs_stage_due() == 1
        assert len(list(listener.notifies(timeout=2, stop_after=1))) == 1
