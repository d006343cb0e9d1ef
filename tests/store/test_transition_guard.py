"""The suite runs with a trigger that rejects state changes ``TRANSITIONS`` does not list."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DatabaseError, transaction
from django.utils import timezone

from django_dispatch.core.states import TRANSITIONS, JobState
from django_dispatch.models import Job
from tests.conftest import postgres_only
from tests.testapp import tasks
from tests.transitions import allowed_pairs

pytestmark = [postgres_only, pytest.mark.django_db]


def test_the_guard_is_generated_from_the_table():
    assert len(allowed_pairs()) == sum(len(dsts) for dsts in TRANSITIONS.values())
    assert ("pending", "running") in allowed_pairs()
    assert ("succeeded", "pending") not in allowed_pairs()


def test_an_unlisted_transition_is_rejected_by_the_database():
    job_id = tasks.add.enqueue(1, 2).id
    with (
        pytest.raises(DatabaseError, match="transition pending -> succeeded"),
        transaction.atomic(),
    ):
        Job.objects.filter(pk=job_id).update(state=JobState.SUCCEEDED)
    Job.objects.filter(pk=job_id).update(state=JobState.CANCELLED)  # listed: allowed
    with (
        pytest.raises(DatabaseError, match="transition cancelled -> pending"),
        transaction.atomic(),
    ):
        Job.objects.filter(pk=job_id).update(state=JobState.PENDING)


def test_a_job_blocked_without_a_reason_the_counts_can_see_is_rejected():
    """The live counts read blocked jobs through the partition, concurrency and
    queue-limit indexes only (``store.base.LIVE_JOBS_BY_STATE``)."""
    bare = tasks.add.enqueue(1, 2).id
    with (
        pytest.raises(DatabaseError, match="blocked without a partition key"),
        transaction.atomic(),
    ):
        Job.objects.filter(pk=bare).update(state=JobState.BLOCKED)
    keyed = tasks.add.using(partition_key="k").enqueue(1, 2).id
    Job.objects.filter(pk=keyed).update(state=JobState.BLOCKED)  # behind its partition: allowed


def test_workflow_runs_and_steps_are_guarded_by_their_tables():
    """The runs' and the steps' tables (``core.workflow_states``) guard them the same way."""
    from django_dispatch.core.workflow_states import RunState, StepState
    from django_dispatch.models import WorkflowRun, WorkflowTask
    from tests.testapp.workflows import three

    run = three.start({"n": 1})
    steps = WorkflowTask.objects.filter(run_id=run.id)
    pending = steps.filter(state=StepState.PENDING).values_list("id", flat=True)[0]
    with (
        pytest.raises(DatabaseError, match="transition pending -> succeeded"),
        transaction.atomic(),
    ):
        steps.filter(id=pending).update(state=StepState.SUCCEEDED)
    steps.filter(id=pending).update(state=StepState.SKIPPED)  # an operator's skip: allowed
    runs = WorkflowRun.objects.filter(id=run.id)
    runs.update(state=RunState.CANCELLED)  # listed: allowed
    with (
        pytest.raises(DatabaseError, match="transition cancelled -> stuck"),
        transaction.atomic(),
    ):
        runs.update(state=RunState.STUCK)


def test_scheduled_jobs_move_only_as_the_table_says():
    """A deferred job becomes pending (staged) or cancelled; a running one may go
    back to scheduled (a retry backing off); nothing reschedules a pending job,
    and a scheduled job is never leased without being staged first."""
    later = timezone.now() + timedelta(hours=1)
    job_id = tasks.add.using(run_after=later).enqueue(1, 2).id
    assert Job.objects.get(pk=job_id).state == JobState.SCHEDULED
    with (
        pytest.raises(DatabaseError, match="transition scheduled -> running"),
        transaction.atomic(),
    ):
        Job.objects.filter(pk=job_id).update(state=JobState.RUNNING)
    Job.objects.filter(pk=job_id).update(state=JobState.PENDING)  # staged: allowed
    with (
        pytest.raises(DatabaseError, match="transition pending -> scheduled"),
        transaction.atomic(),
    ):
        Job.objects.filter(pk=job_id).update(state=JobState.SCHEDULED)
    Job.objects.filter(pk=job_id).update(state=JobState.RUNNING)
    Job.objects.filter(pk=job_id).update(state=JobState.SCHEDULED)  # a retry's backoff
    Job.objects.filter(pk=job_id).update(state=JobState.CANCELLED)
