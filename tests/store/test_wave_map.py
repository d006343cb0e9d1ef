"""Map children's successes written by the wave that finishes their jobs
(``store.workflows.mapwave``, migration 0036).

What must hold is what holds for a child's own one-statement success: the
same fences (its claim, its run a running uncounted child), counted once,
the set gathered by the count that reaches its total, in input order; and a
child the wave does not write has its success written by the general path,
as does a child whose job is finished other than by such a wave.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import Job, WorkflowRun, WorkflowTask
from django_dispatch.store import jobs_claim
from django_dispatch.store import workflows as wf_store
from django_dispatch.store.wave import WaveClaim, jobs_finish_many_and_claim
from django_dispatch.store.workflows import mapwave, preclaim
from django_dispatch.testing import drain
from django_dispatch.workflows.engine import build_step_job
from tests.conftest import postgres_only
from tests.testapp import map_workflows as mw
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

DB = "default"
WORKER = "w-map"


@pytest.fixture(autouse=True)
def _steps_expected():
    preclaim.STEP_JOBS.left = preclaim.STEP_JOBS.CLAIMS
    yield
    preclaim.STEP_JOBS.left = 0
    mapwave._pending.clear()


def _children(key: str, count: int):
    """A map of ``count`` children whose jobs a wave leased, each step taken
    by its attempt: [(claimed job, claimed step)] in input order."""
    run = mw.fan.start({"key": key, "count": count})
    drain(max_jobs=1)  # spread: the children's jobs are ready
    wave = jobs_finish_many_and_claim([], db=DB, claim=WaveClaim(WORKER, 50, 30.0))
    pairs = []
    for job in wave.claimed:
        step_id, generation = Job.objects.get(pk=job.id).args
        taken = wf_store.workflow_step_claim(step_id, generation, job.id, epoch=job.lease.epoch)
        assert taken is not None and taken.preclaimed and taken.map_batch
        pairs.append((job, taken))
    pairs.sort(key=lambda pair: pair[1].run_id)
    return run, pairs


def _defer(job, claimed, output: Any, calls: list[int]) -> bool:
    return wf_store.workflow_step_succeed_with_job(
        claimed,
        output,
        job.id,
        job.lease.epoch,
        build_job=build_step_job,
        fallback=lambda: calls.append(claimed.run_id),
    )


def _spread(run: WorkflowRun) -> WorkflowTask:
    return WorkflowTask.objects.get(run=run, name="spread")


def test_children_succeed_in_their_jobs_wave_counted_once_per_set_and_gathered():
    run, pairs = _children("in-wave", 4)
    (job0, first), rest = pairs[0], pairs[1:]
    calls: list[int] = []
    assert not _defer(job0, first, 0, calls)  # the set is not known yet: written now
    assert wf_store.workflow_step_succeed(
        first.step_id, first.claim_id, 0, build_job=build_step_job,
        run_id=first.run_id, map_child=True,
    )  # fmt: skip
    assert all(_defer(job, claimed, 2 * n, calls) for n, (job, claimed) in enumerate(rest, 1))
    results = [(job.lease, {"ok": True}) for job, _ in pairs]
    with CaptureQueriesContext(connection) as statements:
        wave = jobs_finish_many_and_claim(results, db=DB, claim=None)
    (sql,) = [q["sql"] for q in statements.captured_queries]
    assert "django_dispatch_finish_map_wave" in sql
    assert wave.won == {job.id for job, _ in pairs}
    for _, claimed in rest:
        child = WorkflowRun.objects.get(pk=claimed.run_id)
        assert (child.state, child.map_counted) == (RunState.SUCCEEDED, True)
        step = WorkflowTask.objects.get(pk=claimed.step_id)
        assert (step.state, step.claim_id) == (StepState.SUCCEEDED, None)
    assert _spread(run).map_done == 1  # counted after the commit, by the follow-ups
    assert len(wave.after) == 1  # one count for the set
    for action in wave.after:
        action()
    assert calls == []
    assert _spread(run).state == StepState.SUCCEEDED  # the last count gathered
    drain(max_jobs=5)
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.output == {"doubled": [0, 2, 4, 6]}


def test_a_child_the_wave_cannot_write_is_left_to_its_fallback():
    run, pairs = _children("void", 3)
    (_, first), (job1, voided), (job2, kept) = pairs
    wf_store.workflow_step_succeed(
        first.step_id, first.claim_id, 0, build_job=build_step_job,
        run_id=first.run_id, map_child=True,
    )  # fmt: skip
    calls: list[int] = []
    assert _defer(job1, voided, 2, calls) and _defer(job2, kept, 4, calls)
    # The voided child's claim is taken over (its job's re-run) before the wave.
    WorkflowTask.objects.filter(pk=voided.step_id).update(claim_id="0" * 32)
    results = [(job.lease, None) for job, _ in pairs]
    wave = jobs_finish_many_and_claim(results, db=DB, claim=None)
    assert WorkflowTask.objects.get(pk=voided.step_id).state == StepState.RUNNING
    assert WorkflowTask.objects.get(pk=kept.step_id).state == StepState.SUCCEEDED
    for action in wave.after:
        action()
    assert calls == [voided.run_id]
    assert _spread(run).map_done == 2


def test_a_child_whose_job_is_finished_otherwise_is_written_first():
    _, pairs = _children("flush", 3)
    (_, first), (job1, one), (job2, two) = pairs
    wf_store.workflow_step_succeed(
        first.step_id, first.claim_id, 0, build_job=build_step_job,
        run_id=first.run_id, map_child=True,
    )  # fmt: skip
    calls: list[int] = []
    assert _defer(job1, one, 2, calls) and _defer(job2, two, 4, calls)
    mapwave.flush(DB, job1.id, job1.lease.epoch + 1)  # another lease's: not this one
    assert calls == []
    mapwave.flush(DB, job1.id, job1.lease.epoch)  # a success written one by one
    assert calls == [one.run_id]
    with transaction.atomic():  # a wave in a transaction: written first, by the general path
        wave = jobs_finish_many_and_claim([(job2.lease, None)], db=DB, claim=None)
    assert calls == [one.run_id, two.run_id] and wave.after == []
    assert mapwave.pending(DB, [(job1.id, job1.lease.epoch), (job2.id, job2.lease.epoch)]) == []


def test_a_map_wave_with_keyed_successes_promotes_and_claims_in_the_same_statement():
    """The children's wave takes every other wave's paths: keyed successes
    (their keys' next jobs promoted and claimed) and the claim with its steps."""
    run, pairs = _children("keyed", 2)
    (_, first), (job1, child) = pairs
    wf_store.workflow_step_succeed(
        first.step_id, first.claim_id, 0, build_job=build_step_job,
        run_id=first.run_id, map_child=True,
    )  # fmt: skip
    k1, k2 = (int(tasks.add.using(partition_key="MK").enqueue(i, 0).id) for i in range(2))
    (keyed,) = jobs_claim(worker_id=WORKER, queues=(), limit=2, lease_seconds=30)
    assert keyed.id == k1
    calls: list[int] = []
    assert _defer(job1, child, 2, calls)
    results = [(job1.lease, None), (keyed.lease, 1)]
    wave = jobs_finish_many_and_claim(results, db=DB, claim=WaveClaim(WORKER, 5, 30.0))
    assert wave.won == {job1.id, k1}
    assert [c.id for c in wave.claimed] == [k2]  # promoted, then claimed
    assert WorkflowTask.objects.get(pk=child.step_id).state == StepState.SUCCEEDED
    for action in wave.after:
        action()
    assert calls == [] and _spread(run).state == StepState.SUCCEEDED
