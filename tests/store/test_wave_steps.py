"""The steps of step jobs claimed by the wave or the claim that leases the jobs
(``store.workflows.preclaim``, migration 0035).

What must hold is what holds for a step job's own claim
(``workflow_step_claim``): only a leased job's step, only while ``ready``,
for its generation, with a claim id of its own; the job's attempt takes that
claim once, with no statement; a step row another transaction holds is left
for the job to claim itself, and the wave does not wait for it.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_dispatch.core.workflow_states import StepState
from django_dispatch.models import Job, WorkflowTask
from django_dispatch.runtime import outcomes
from django_dispatch.runtime.outcomes import release
from django_dispatch.store import jobs_claim
from django_dispatch.store import workflows as wf_store
from django_dispatch.store.wave import WaveClaim, jobs_finish_many_and_claim
from django_dispatch.store.workflows import preclaim
from django_dispatch.workflows.tasks import run_step
from tests.conftest import postgres_only
from tests.testapp import map_workflows as mw
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

DB = "default"
WORKER = "w-steps"


@pytest.fixture(autouse=True)
def _steps_expected():
    """Every claim of these tests carries the step claim."""
    preclaim.STEP_JOBS.left = preclaim.STEP_JOBS.CLAIMS
    yield
    preclaim.STEP_JOBS.left = 0


def _wave(limit: int = 10):
    return jobs_finish_many_and_claim([], db=DB, claim=WaveClaim(WORKER, limit, 30.0))


def _step_of(job: Job) -> WorkflowTask:
    return WorkflowTask.objects.get(pk=job.args[0])


def test_a_leased_step_jobs_step_is_claimed_and_its_attempt_takes_the_claim_once():
    run = mw.item.start({"key": "pre", "n": 1})
    plain = int(tasks.add.enqueue(1, 2).id)
    wave = _wave()
    claimed = {c.id: c for c in wave.claimed}
    job = Job.objects.get(task_path=preclaim.STEP_TASK)
    assert set(claimed) == {job.id, plain}
    step = _step_of(job)
    assert (step.state, step.attempts, step.run_id) == (StepState.RUNNING, 1, run.pk)
    assert step.claim_id and len(step.claim_id) == 32
    with CaptureQueriesContext(connection) as queries:
        taken = wf_store.workflow_step_claim(
            step.pk, step.generation, job.id, epoch=claimed[job.id].lease.epoch
        )
    assert queries.captured_queries == []  # taken from the wave, no statement
    assert taken is not None and taken.claim_id == step.claim_id
    assert (taken.run_id, taken.input, taken.attempt, taken.map_child) == (
        run.pk,
        {"key": "pre", "n": 1},
        1,
        False,
    )
    # Once: a second call is a re-run's claim, which takes the running step over.
    again = wf_store.workflow_step_claim(step.pk, step.generation, job.id, epoch=job.lease_epoch)
    assert again is not None and again.claim_id != step.claim_id
    assert preclaim.take(DB, step.pk, step.generation, job.id, job.lease_epoch) is None


def test_a_claim_is_only_for_the_attempt_of_its_lease():
    mw.item.start({"key": "epoch", "n": 4})
    (leased,) = _wave().claimed
    step = _step_of(Job.objects.get(pk=leased.id))
    epoch = leased.lease.epoch
    assert preclaim.take(DB, step.pk, step.generation, leased.id, epoch + 1) is None
    assert preclaim.take("other", step.pk, step.generation, leased.id, epoch) is None
    # Left by those calls for the lease's own attempt, which takes it with no statement.
    taken = wf_store.workflow_step_claim(step.pk, step.generation, leased.id, epoch=epoch)
    assert taken is not None and taken.claim_id == step.claim_id


def test_a_claim_kept_past_its_freshness_is_read_again_and_a_cancelled_step_not_run(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(preclaim, "FRESH_SECONDS", 0.0)
    held = mw.item.start({"key": "stale-held", "n": 10})
    voided = mw.item.start({"key": "stale-voided", "n": 11})
    claimed = {Job.objects.get(pk=c.id).args[0]: c for c in _wave().claimed}
    by_run = {s.run_id: s for s in WorkflowTask.objects.filter(pk__in=claimed)}
    assert wf_store.workflow_run_cancel(voided.pk)  # after the wave committed its claim
    step = by_run[voided.pk]
    job = claimed[step.pk]
    with CaptureQueriesContext(connection) as queries:
        taken = wf_store.workflow_step_claim(
            step.pk, step.generation, job.id, epoch=job.lease.epoch
        )
    assert taken is None  # the cancelled step's handler never runs
    assert queries.captured_queries  # it was read again
    step = by_run[held.pk]
    job = claimed[step.pk]
    taken = wf_store.workflow_step_claim(step.pk, step.generation, job.id, epoch=job.lease.epoch)
    assert taken is not None and taken.claim_id == step.claim_id  # still held: handed out


def test_a_wave_inside_a_transaction_claims_no_step():
    mw.item.start({"key": "atomic", "n": 5})
    with transaction.atomic():
        (leased,) = _wave().claimed
    step = _step_of(Job.objects.get(pk=leased.id))
    assert (step.state, step.claim_id) == (StepState.READY, None)


def test_a_step_row_held_elsewhere_is_left_to_its_job_and_the_wave_does_not_wait():
    mw.item.start({"key": "held", "n": 2})
    job = Job.objects.get(task_path=preclaim.STEP_TASK)
    step = _step_of(job)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                WorkflowTask.objects.select_for_update().get(pk=step.pk)
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        wave = _wave()
        assert [c.id for c in wave.claimed] == [job.id]
        assert WorkflowTask.objects.get(pk=step.pk).state == StepState.READY
    finally:
        release.set()
        holder.join()
    epoch = wave.claimed[0].lease.epoch
    assert preclaim.take(DB, step.pk, step.generation, job.id, epoch) is None
    taken = wf_store.workflow_step_claim(step.pk, step.generation, job.id, epoch=epoch)
    assert taken is not None
    assert WorkflowTask.objects.get(pk=step.pk).claim_id == taken.claim_id


def test_a_run_step_job_with_other_arguments_claims_nothing_and_fails_no_wave():
    odd = int(run_step.enqueue(1.5, "x").id)
    plain = int(tasks.add.enqueue(1, 2).id)
    wave = _wave()
    assert {c.id for c in wave.claimed} == {odd, plain}
    assert all(preclaim.take(DB, 1, 1, odd, c.lease.epoch) is None for c in wave.claimed)


def test_a_step_of_another_generation_is_not_claimed_by_the_wave():
    mw.item.start({"key": "gen", "n": 3})
    job = Job.objects.get(task_path=preclaim.STEP_TASK)
    WorkflowTask.objects.filter(pk=job.args[0]).update(generation=2)  # a reopen's reset
    wave = _wave()
    assert [c.id for c in wave.claimed] == [job.id]
    step = _step_of(job)
    assert (step.state, step.claim_id) == (StepState.READY, None)


def test_a_claim_outside_a_wave_claims_the_steps_it_leases_once_committed():
    mw.item.start({"key": "claim", "n": 6})
    (leased,) = jobs_claim(worker_id=WORKER, queues=(), limit=5, lease_seconds=30)
    step = _step_of(Job.objects.get(pk=leased.id))
    assert step.state == StepState.RUNNING
    taken = wf_store.workflow_step_claim(
        step.pk, step.generation, leased.id, epoch=leased.lease.epoch
    )
    assert taken is not None and taken.claim_id == step.claim_id


def test_a_claim_rolled_back_keeps_no_step_claim():
    mw.item.start({"key": "rollback", "n": 7})
    with pytest.raises(RuntimeError), transaction.atomic():
        (leased,) = jobs_claim(worker_id=WORKER, queues=(), limit=5, lease_seconds=30)
        raise RuntimeError("the caller's transaction fails")
    job = Job.objects.get(task_path=preclaim.STEP_TASK)
    step = _step_of(job)
    assert (step.state, step.claim_id) == (StepState.READY, None)
    assert preclaim.take(DB, step.pk, step.generation, job.id, leased.lease.epoch) is None


def test_a_job_handed_back_unstarted_has_its_steps_claim_undone():
    mw.item.start({"key": "back", "n": 8})
    (leased,) = _wave().claimed
    step = _step_of(Job.objects.get(pk=leased.id))
    assert (step.state, step.attempts) == (StepState.RUNNING, 1)
    assert step.started_at is not None
    assert release(leased, why="handed back at shutdown")
    step.refresh_from_db()
    assert (step.state, step.attempts, step.claim_id) == (StepState.READY, 0, None)
    assert step.started_at is None  # as before the claim: it never started
    (again,) = _wave().claimed  # the job's next run: a ready step, no lost attempt
    step.refresh_from_db()
    assert again.id == leased.id and (step.state, step.attempts) == (StepState.RUNNING, 1)
    taken = wf_store.workflow_step_claim(
        step.pk, step.generation, again.id, epoch=again.lease.epoch
    )
    assert taken is not None and taken.claim_id == step.claim_id
    assert step.errors == []


def test_a_claim_taken_by_its_attempt_is_not_undone():
    mw.item.start({"key": "taken", "n": 9})
    (leased,) = _wave().claimed
    step = _step_of(Job.objects.get(pk=leased.id))
    wf_store.workflow_step_claim(step.pk, step.generation, leased.id, epoch=leased.lease.epoch)
    assert not preclaim.release(DB, leased.id, leased.lease.epoch)
    step.refresh_from_db()
    assert step.state == StepState.RUNNING


def test_a_handed_back_jobs_step_is_ready_before_the_job_is_back_in_the_queue(
    monkeypatch: pytest.MonkeyPatch,
):
    """Once back in the queue the job may run elsewhere at once: its attempt must
    find the step ready, never see it voided under a takeover of its own."""
    mw.item.start({"key": "order", "n": 12})
    (leased,) = _wave().claimed
    step = _step_of(Job.objects.get(pk=leased.id))
    seen = []
    release_job = outcomes.store.job_release_if_leased

    def watched(*args, **kwargs):
        seen.append(WorkflowTask.objects.values_list("state", flat=True).get(pk=step.pk))
        return release_job(*args, **kwargs)

    monkeypatch.setattr(outcomes.store, "job_release_if_leased", watched)
    assert release(leased, why="claimed ahead, behind a job that ran long")
    assert seen == [StepState.READY]
    assert Job.objects.get(pk=leased.id).state == "pending"
