"""A large ``ctx.map`` set of one-step children, run several children by one job.

PostgreSQL only: elsewhere every child keeps a job of its own. Children are
counted in SideEffect rows (no unique key), one per execution of a body.
"""

from __future__ import annotations

import signal
import threading

import pytest
from django.db import connection

from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import Job, WorkflowRun, WorkflowTask
from django_dispatch.states import JobState
from django_dispatch.store import carrying_database
from django_dispatch.store import workflows as wf_store
from django_dispatch.store.maintenance import job_cancel
from django_dispatch.store.workflows import mapbatch
from django_dispatch.store.workflows.stepjobs import BATCH_TASK
from django_dispatch.testing import drain
from django_dispatch.workflows import cancel_run, run_now, skip_step
from django_dispatch.workflows.engine import build_step_job
from django_dispatch.workflows.testing import drain_workflows
from tests.conftest import postgres_only, wait_until
from tests.runtime.test_workflow_maps import executions, fan, kids, run_to_end, spread
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

#: Enough children for batches of three (``mapbatch.MIN_JOBS``).
MANY = 3 * mapbatch.MIN_JOBS + 1


def batch_jobs(run: WorkflowRun) -> list[Job]:
    steps = WorkflowTask.objects.filter(run__parent_run=run)
    jobs = Job.objects.filter(task_path=BATCH_TASK, id__in=steps.values("job_id"))
    return list(jobs.order_by("id"))


def test_a_large_set_runs_its_children_in_batches_each_once_in_input_order():
    run = run_to_end(fan("batched", MANY))
    assert run.state == RunState.SUCCEEDED
    assert run.output == {"doubled": [2 * n for n in range(MANY)]}
    assert executions("batched") == {n: 1 for n in range(MANY)}
    jobs = batch_jobs(run)
    # The first child keeps a job of its own; the others go three by three.
    assert len(jobs) == (MANY - 1) // 3
    assert {len(job.args[0]) for job in jobs} == {3}
    assert {job.state for job in jobs} == {JobState.SUCCEEDED}
    for job in jobs:
        steps = WorkflowTask.objects.filter(job_id=job.pk).order_by("id")
        assert [[s.pk, s.generation] for s in steps] == job.args[0]
        assert job.return_value == {"steps": 3, "succeeded": 3}
    step = spread(run)
    assert (step.map_done, step.map_total) == (MANY, MANY)


def test_small_sets_and_bounded_sets_keep_a_job_per_child():
    small = run_to_end(fan("small", 2 * mapbatch.MIN_JOBS - 1))
    bounded = run_to_end(fan("bounded", MANY, max_parallel=MANY))
    for run in (small, bounded):
        assert run.state == RunState.SUCCEEDED
        assert batch_jobs(run) == []


def test_a_child_failing_in_a_batch_retries_on_a_job_of_its_own():
    failing = [1, 5, 6]
    run = run_to_end(fan("retried", MANY, retried=True, fail_once=failing))
    assert run.state == RunState.SUCCEEDED
    assert run.output == {"doubled": [2 * n for n in range(MANY)]}
    assert executions("retried") == {n: 2 if n in failing else 1 for n in range(MANY)}
    for child in kids(run):
        step = WorkflowTask.objects.get(run=child)
        task = Job.objects.get(pk=step.job_id).task_path
        assert (task == BATCH_TASK) == (child.map_index not in [*failing, 0]), child.map_index
        assert step.attempts == (2 if child.map_index in failing else 1)


def test_skipping_a_batched_childs_step_leaves_its_batch_to_the_others():
    run = fan("skip", MANY)
    drain(max_jobs=1)  # the parent's first step: the set is inserted
    second = kids(run)[2]
    assert skip_step(second.pk, "double")
    step = WorkflowTask.objects.get(run=second)
    assert Job.objects.get(pk=step.job_id).state == JobState.PENDING  # not cancelled
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED
    doubled = run.output["doubled"]
    assert doubled[2] is None and doubled[:2] == [0, 2] and doubled[3] == 6
    assert executions("skip") == {n: 1 for n in range(MANY) if n != 2}


def test_a_batch_whose_attempt_was_lost_takes_its_claimed_steps_over():
    run = fan("lost", MANY)
    drain(max_jobs=1)
    job = batch_jobs(run)[0]
    pairs = [(s, g) for s, g in job.args[0]]
    # A lost attempt: its claims made, no body run, nothing written after.
    lost = wf_store.workflow_steps_claim(pairs, job.pk)
    assert all(c is not None for c in lost)
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED
    assert executions("lost") == {n: 1 for n in range(MANY)}
    for step_id, _ in pairs:
        step = WorkflowTask.objects.get(pk=step_id)
        assert step.state == StepState.SUCCEEDED and step.attempts == 2
        assert "lost job" in step.errors[-1]["message"]


def test_cancelling_the_run_cancels_its_batched_children():
    run = fan("cancelled", MANY)
    drain(max_jobs=1)
    assert cancel_run(run.pk)
    assert not WorkflowRun.objects.filter(parent_run=run, state=RunState.RUNNING).exists()
    drain_workflows()
    assert executions("cancelled") == {}


@pytest.mark.slow
def test_a_killed_worker_loses_no_batched_child(start_worker):
    """A worker SIGKILLed while running batches: every child still runs, the
    set gathers in order, and only a batch the killed worker held runs twice."""
    run = fan("killed", MANY, sleep=0.01)
    first = start_worker("--concurrency", "4")
    wait_until(lambda: len(executions("killed")) > 100, timeout=60, what="children running")
    first.signal(signal.SIGKILL)
    first.wait()
    second = start_worker("--concurrency", "4")
    wait_until(
        lambda: WorkflowRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED,
        timeout=120,
        what="the map's run finished after the kill",
    )
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.output()
    run.refresh_from_db()
    assert run.output == {"doubled": [2 * n for n in range(MANY)]}
    counts = executions("killed")
    assert set(counts) == set(range(MANY))
    twice = [n for n, c in counts.items() if c > 1]
    assert max(counts.values()) <= 2
    assert len(twice) <= 4 * 3  # at most the batches of the killed worker's threads
    assert connection.vendor == "postgresql"


def test_a_batch_job_that_ended_leaves_each_child_a_job_of_its_own_uncharged():
    """Cancelled from the jobs admin (as a worker of an earlier version would
    fail it, or a child that keeps killing its workers): the sweep charges none
    of its children an attempt, and each runs by a job of its own."""
    run = fan("ended", MANY)
    drain(max_jobs=1)
    job = batch_jobs(run)[0]
    assert job_cancel(job.pk)
    swept = wf_store.sweep_stale_steps(0, build_job=build_step_job, limit=2 * MANY)
    assert sorted(swept) == sorted(s for s, _ in job.args[0])
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED
    assert executions("ended") == {n: 1 for n in range(MANY)}
    for step_id, _ in job.args[0]:
        step = WorkflowTask.objects.get(pk=step_id)
        assert (step.state, step.failures, step.attempts) == (StepState.SUCCEEDED, 0, 1)
        assert "no attempt counted" in step.errors[-1]["message"]
        assert Job.objects.get(pk=step.job_id).task_path.endswith(".run_step")


def run_batch_in_background(run: WorkflowRun) -> threading.Thread:
    """Drain the parent's step, then, on a thread, the first child's own job and
    the first batch (children 1 to 3)."""
    drain(max_jobs=1)
    thread = threading.Thread(target=carrying_database(lambda: drain(max_jobs=2)), daemon=True)
    thread.start()
    return thread


def started(key: str, n: int) -> bool:
    return SideEffect.objects.filter(key=key, note=f"item:{n}").exists()


def test_a_child_skipped_while_its_batch_runs_an_earlier_one_does_not_run():
    """The batch claimed children 1 to 3 together; child 3, skipped while child 1
    runs (2 s), is read again before its turn and not run."""
    run = fan("recheck", MANY, pause_on=[1], pause=2.0)
    thread = run_batch_in_background(run)
    wait_until(lambda: started("recheck", 1), what="child 1 running")
    third = kids(run)[3]
    assert WorkflowTask.objects.get(run=third).state == StepState.RUNNING  # claimed
    assert skip_step(third.pk, "double")
    thread.join(30)
    assert not started("recheck", 3)
    assert started("recheck", 2)
    job = batch_jobs(run)[0]
    assert job.return_value == {"steps": 3, "succeeded": 2, "superseded": 1}


def test_a_batch_writes_the_successes_it_holds_while_a_slow_child_runs():
    """Children 2 and 3 take 1.5 s each: once child 3 starts, the successes of
    children 1 and 2 are written, not held until the batch ends."""
    run = fan("flushed", MANY, pause_on=[2, 3], pause=1.5)
    thread = run_batch_in_background(run)
    wait_until(lambda: started("flushed", 3), what="child 3 running")
    states = {c.map_index: WorkflowTask.objects.get(run=c).state for c in kids(run)[1:4]}
    assert states == {1: StepState.SUCCEEDED, 2: StepState.SUCCEEDED, 3: StepState.RUNNING}
    thread.join(30)
    assert WorkflowTask.objects.get(run=kids(run)[3]).state == StepState.SUCCEEDED


def test_a_batch_cancelled_while_it_runs_puts_its_unstarted_children_back_unspent():
    """Cancelled from the jobs admin while child 1 runs (2 s): children 2 and 3 never
    start, go back to ``ready`` with no attempt spent, and the sweep gives each
    a job of its own."""
    run = fan("stopped", MANY, pause_on=[1], pause=2.0)
    thread = run_batch_in_background(run)
    wait_until(lambda: started("stopped", 1), what="child 1 running")
    job = batch_jobs(run)[0]
    assert job_cancel(job.pk)
    thread.join(30)
    for child in kids(run)[2:4]:
        step = WorkflowTask.objects.get(run=child)
        assert (step.state, step.attempts, step.started_at) == (StepState.READY, 0, None)
    assert not started("stopped", 2) and not started("stopped", 3)
    swept = wf_store.sweep_stale_steps(0, build_job=build_step_job, limit=2 * MANY)
    assert {WorkflowTask.objects.get(run=c).pk for c in kids(run)[1:4]} <= set(swept)
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED
    # Child 1 was running when its job was cancelled: its result was discarded
    # with the job's, and it ran again on a job of its own.
    assert executions("stopped") == {n: 2 if n == 1 else 1 for n in range(MANY)}


def test_run_now_leaves_a_batched_child_to_the_workers():
    """Its step's job is its batch's, which would run the batch's other children
    in the caller's process too."""
    run = fan("now", MANY)
    drain(max_jobs=1)
    assert run_now(kids(run)[2].pk) == []
    assert run_now(kids(run)[0].pk) != []  # the first child's job is its own
    assert executions("now") == {0: 1}
