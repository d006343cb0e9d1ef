"""Workflows: definition checks, the engine through real workers, operator actions."""

from __future__ import annotations

import signal
import threading
import time
from functools import partial

import pytest
from django.db import connection, transaction

from django_dispatch import store
from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import Job, WorkflowRun, WorkflowTask
from django_dispatch.states import JobState
from django_dispatch.store import workflows as wf_store
from django_dispatch.testing import drain
from django_dispatch.workflows import (
    ActionNotAllowed,
    AlreadyReopened,
    Workflow,
    WorkflowDefinitionError,
    cancel_run,
    children,
    oldest_runnable_age,
    replay_run,
    retry_run,
    skip_step,
)
from django_dispatch.workflows.definition import check_graph
from django_dispatch.workflows.engine import build_step_job
from django_dispatch.workflows.testing import drain_workflows
from tests.concurrency import run_concurrently
from tests.conftest import wait_until
from tests.testapp import workflows as wfs
from tests.testapp.models import SideEffect

RUN_STEP = "django_dispatch.workflows.tasks.run_step"


def run_to_end(run: WorkflowRun, *, concurrency: int = 1) -> WorkflowRun:
    """Drain through the real worker path until nothing is runnable; backoffs skipped."""
    drain_workflows(concurrency=concurrency)
    run.refresh_from_db()
    return run


def step(run: WorkflowRun, name: str) -> WorkflowTask:
    return WorkflowTask.objects.get(run=run, name=name)


def effects(key: str, note: str | None = None) -> int:
    qs = SideEffect.objects.filter(key=key)
    return (qs.filter(note=note) if note else qs).count()


# --- definitions (no database) ---------------------------------------------------------


def ok(ctx):
    return 1


def other(ctx):
    return 2


def no_args():
    return 3


def test_steps_default_to_the_previous_step_and_after_takes_names_or_functions():
    wf = Workflow("tests.def-order")
    wf.add_step(ok)
    wf.add_step(other)
    wf.add_step(ok, name="again", after=[ok, "other"])
    assert [(s.name, s.depends_on) for s in wf.steps] == [
        ("ok", ()),
        ("other", ("ok",)),
        ("again", ("ok", "other")),
    ]
    assert wf.steps[0].handler_path == "tests.runtime.test_workflows.ok"


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([("a", []), ("a", [])], "duplicate step name 'a'"),
        ([("a", ["zz"])], "unknown step 'zz'"),
        ([("a", ["a"])], "cannot depend on itself"),
        ([("a", ["b"]), ("b", ["a"])], "defined after it: this is a cycle"),
        ([("a", []), ("b", ["a", "a"])], "lists a dependency twice"),
    ],
)
def test_graph_errors_are_clear(steps, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        check_graph(steps)


def test_definition_errors_are_raised_at_definition_time():
    wf = Workflow("tests.def-errors")
    wf.add_step(ok)
    with pytest.raises(WorkflowDefinitionError, match="duplicate step name 'ok'"):
        wf.add_step(ok)
    with pytest.raises(WorkflowDefinitionError, match="unknown step 'nope'"):
        wf.add_step(other, after=["nope"])
    with pytest.raises(WorkflowDefinitionError, match="module level"):
        wf.add_step(lambda ctx: 1, name="anon")

    def nested(ctx):
        return 1

    with pytest.raises(WorkflowDefinitionError, match="module level"):
        wf.add_step(nested)
    with pytest.raises(WorkflowDefinitionError, match="exactly one argument"):
        wf.add_step(no_args)
    with pytest.raises(WorkflowDefinitionError, match="max_attempts"):
        wf.add_step(other, max_attempts=0)
    with pytest.raises(WorkflowDefinitionError, match="timeout"):
        wf.add_step(other, timeout=-1)
    with pytest.raises(WorkflowDefinitionError, match="backoff"):
        wf.add_step(other, backoff=lambda attempt: 1)
    with pytest.raises(WorkflowDefinitionError, match="list of step names"):
        wf.add_step(other, after="ok")
    assert [s.name for s in wf.steps] == ["ok"]  # nothing half-added
    with pytest.raises(WorkflowDefinitionError, match=r"already defined in tests\.testapp"):
        Workflow("tests.three")  # defined in tests.testapp.workflows


# --- the engine, through real workers -----------------------------------------------------

pytestmark_db = pytest.mark.django_db(transaction=True)


@pytestmark_db
def test_three_steps_with_a_flaky_second_step():
    run = wfs.three.start({"key": "three"})
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED
    assert run.output == {"total": 6, "seen": ["fetch", "flaky_total"]}
    fetch, flaky, report = (step(run, n) for n in ("fetch", "flaky_total", "report"))
    assert (fetch.attempts, fetch.output) == (1, {"items": [1, 2, 3]})
    assert (flaky.state, flaky.attempts, flaky.failures, flaky.output) == (
        StepState.SUCCEEDED,
        3,
        2,
        6,
    )
    assert [e["exception_class_path"] for e in flaky.errors] == ["builtins.ConnectionError"] * 2
    assert [e["attempt"] for e in flaky.errors] == [1, 2]
    assert flaky.errors[0]["message"] == "gateway down (attempt 1)"
    assert "Traceback" in flaky.errors[0]["traceback"] and flaky.errors[0]["at"]
    assert report.attempts == 1
    # Each side effect once, except the flaky step's three attempts.
    assert (effects("three", "fetch"), effects("three", "flaky"), effects("three", "report")) == (
        1,
        3,
        1,
    )
    # Every attempt was its own job, without job-level retries.
    jobs = Job.objects.filter(task_path=RUN_STEP)
    assert jobs.count() == 5 and set(jobs.values_list("max_attempts", flat=True)) == {1}
    assert set(jobs.values_list("state", flat=True)) == {JobState.SUCCEEDED}


@pytestmark_db
def test_start_inserts_run_steps_and_first_jobs_in_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        wfs.fan.start({"key": "rolled-back"})
        assert WorkflowTask.objects.count() == 4
        raise RuntimeError("roll back")
    assert not WorkflowRun.objects.exists() and not Job.objects.exists()

    run = wfs.fan.start({"key": "fan0"})
    states = dict(WorkflowTask.objects.filter(run=run).values_list("name", "state"))
    assert states == {"split": "ready", "left": "pending", "right": "pending", "join": "pending"}
    snapshot = step(run, "join")
    assert snapshot.depends_on == ["left", "right"]
    assert snapshot.handler_path == "tests.testapp.workflows.join"
    (job,) = Job.objects.filter(task_path=RUN_STEP)
    assert job.args == [step(run, "split").pk, 1] and job.pk == step(run, "split").job_id


@pytestmark_db
def test_idempotency_key_returns_the_existing_run():
    one = wfs.three.start({"key": "i"}, idempotency_key="order-1")
    two = wfs.three.start({"key": "other input"}, idempotency_key="order-1")
    assert one.pk == two.pk and two.input == {"key": "i"}
    assert wfs.gated.start({"key": "i"}, idempotency_key="order-1").pk != one.pk  # per workflow
    with transaction.atomic():  # a conflict does not abort the caller's transaction
        wfs.three.start({"key": "i"}, idempotency_key="order-1")
        SideEffect.objects.create(key="after-conflict")
    assert effects("after-conflict") == 1
    assert Job.objects.filter(task_path=RUN_STEP).count() == 2


def lock_waits() -> int:
    """Lock requests waiting now (pg_locks is read live, even inside a transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        return cursor.fetchone()[0]


@pytestmark_db
def test_a_branch_that_waited_for_the_run_lock_sees_the_other_branchs_success():
    """Both branches of a fan-out succeed at once: the one that waited for the run's
    lock must see the other's success, committed meanwhile, or the join never starts."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: SQLite has one writer, so no success waits for a run lock")
    run = wfs.fan.start({"key": "lock-wait"})
    drain(max_jobs=1)  # split: both branches get their jobs
    branches = WorkflowTask.objects.filter(run=run, name__in=["left", "right"]).order_by("name")
    claims = [wf_store.workflow_step_claim(s.pk, s.generation, s.job_id) for s in branches]
    assert all(claims)
    left, right = claims
    assert left is not None and right is not None

    def second() -> None:
        try:
            assert wf_store.workflow_step_succeed(
                right.step_id, right.claim_id, 12, build_job=build_step_job, run_id=run.pk
            )
        finally:
            connection.close()

    with transaction.atomic():  # the first branch's success, its commit held back
        assert wf_store.workflow_step_succeed(
            left.step_id, left.claim_id, 11, build_job=build_step_job, run_id=run.pk
        )
        thread = threading.Thread(target=second)
        thread.start()
        wait_until(lock_waits, what="the second success waiting for the run's lock")
    thread.join(10)
    join = WorkflowTask.objects.get(run=run, name="join")
    assert join.state == StepState.READY and join.job_id is not None


@pytestmark_db
def test_concurrent_starts_with_one_key_create_one_run():
    def start() -> int:
        with transaction.atomic():
            run = wfs.three.start({"key": "race"}, idempotency_key="race")
            time.sleep(0.05)  # hold the transaction open while the others try
        return run.pk

    ids = run_concurrently(*[start] * 6, together=True)
    assert len(ids) == 6 and len(set(ids)) == 1
    assert WorkflowRun.objects.count() == 1 and WorkflowTask.objects.count() == 3
    assert Job.objects.filter(task_path=RUN_STEP).count() == 1


@pytestmark_db
def test_fan_out_runs_branches_in_parallel_and_fans_in_once():
    run = run_to_end(wfs.fan.start({"key": "fan"}), concurrency=2)
    assert run.state == RunState.SUCCEEDED and run.output == 23
    notes = list(SideEffect.objects.filter(key="fan").order_by("id").values_list("note", flat=True))
    # Each branch waited for the other to start before ending: they overlapped.
    assert notes[0] == "a" and notes[-1] == "d" and notes.count("d") == 1
    assert set(notes[1:3]) == {"b-start", "c-start"}
    assert set(notes[3:5]) == {"b-end", "c-end"}
    assert step(run, "join").attempts == 1


@pytestmark_db
def test_a_stuck_run_is_parked_until_unparked():
    run = run_to_end(wfs.gated.start({"key": "park"}))
    gate = step(run, "gate")
    assert run.state == RunState.STUCK
    assert (gate.state, gate.attempts, gate.failures) == (StepState.FAILED, 2, 2)
    assert [e["exception_class_path"] for e in gate.errors] == ["builtins.PermissionError"] * 2
    assert step(run, "finish").state == StepState.PENDING
    assert not retry_run(WorkflowRun.objects.create(name="x").pk)  # not stuck: no change

    SideEffect.objects.create(key="park", note="open")
    assert retry_run(run.pk)
    assert not retry_run(run.pk)  # already unparked
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED
    gate = step(run, "gate")
    assert (gate.attempts, gate.failures, len(gate.errors)) == (3, 0, 2)  # history kept
    assert run.output["gate"] == "opened on attempt 3, version 0"
    assert effects("park", "prepare") == 1


@pytestmark_db
def test_skipping_the_stuck_step_lets_dependents_run_without_its_output():
    run = run_to_end(wfs.gated.start({"key": "skip"}))
    assert run.state == RunState.STUCK
    assert not skip_step(run.pk, "prepare")  # already done
    assert skip_step(run.pk, "gate")
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED
    assert run.output == {"gate": None, "prepare": "prepared"}
    assert step(run, "gate").state == StepState.SKIPPED
    with pytest.raises(WorkflowTask.DoesNotExist):
        skip_step(run.pk, "nope")


@pytestmark_db
def test_replay_from_a_step_reruns_it_and_its_dependents_with_current_code():
    SideEffect.objects.create(key="replay", note="open")
    run = run_to_end(wfs.gated.start({"key": "replay"}))
    assert run.output["gate"] == "opened on attempt 1, version 0"
    first_job = step(run, "gate").job_id

    SideEffect.objects.create(key="replay", note="version")  # "deploy" new behaviour
    replayed = replay_run(run.pk, "gate")
    assert replayed.generation == 2 and replayed.state == RunState.RUNNING
    gate, prepare = step(run, "gate"), step(run, "prepare")
    assert (gate.state, gate.generation, gate.attempts, gate.output) == (
        StepState.READY,
        2,
        0,
        None,
    )
    assert (prepare.state, prepare.output, prepare.generation) == (
        StepState.SUCCEEDED,
        "prepared",
        1,
    )
    assert gate.job_id != first_job
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED
    assert run.output == {"gate": "opened on attempt 1, version 1", "prepare": "prepared"}
    assert (effects("replay", "prepare"), effects("replay", "gate")) == (1, 2)
    assert effects("replay", "finish") == 2


@pytestmark_db
def test_replay_needs_a_finished_or_stuck_run_and_a_known_step():
    run = wfs.gated.start({"key": "replay-running"})
    with pytest.raises(ActionNotAllowed, match="is running"):
        replay_run(run.pk, "gate")
    assert cancel_run(run.pk)
    with pytest.raises(WorkflowTask.DoesNotExist):
        replay_run(run.pk, "nope")
    with pytest.raises(AlreadyReopened):
        replay_run(run.pk, "prepare", generation=7)
    SideEffect.objects.create(key="replay-running", note="open")
    replay_run(run.pk, "finish")  # a cancelled run restarts every unfinished step
    assert run_to_end(run).state == RunState.SUCCEEDED


@pytestmark_db
def test_two_concurrent_reopens_exactly_one_wins():
    SideEffect.objects.create(key="reopen", note="open")
    run = run_to_end(wfs.gated.start({"key": "reopen"}))

    def reopen(from_step: str) -> str:
        try:
            replay_run(run.pk, from_step, generation=1)
            return "won"
        except AlreadyReopened:
            return "lost"

    outcomes = run_concurrently(
        *(partial(reopen, step) for step in ("prepare", "gate")), together=True
    )
    assert sorted(outcomes) == ["lost", "won"]
    run.refresh_from_db()
    assert run.generation == 2
    ready = WorkflowTask.objects.filter(run=run, state=StepState.READY)
    assert ready.count() == 1  # one reopen's reset, not a mix of both
    assert Job.objects.filter(task_path=RUN_STEP, state=JobState.PENDING).count() == 1


@pytestmark_db
def test_cancelling_a_pending_run_cancels_its_jobs():
    run = wfs.fan.start({"key": "cancel"})
    assert cancel_run(run.pk)
    assert not cancel_run(run.pk)
    assert drain() == 0
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED and run.finished_at is not None
    assert set(WorkflowTask.objects.filter(run=run).values_list("state", flat=True)) == {
        StepState.CANCELLED
    }
    assert Job.objects.get(task_path=RUN_STEP).state == JobState.CANCELLED
    assert effects("cancel") == 0


@pytestmark_db
def test_cancelling_a_run_voids_its_running_steps_claim(tmp_path):
    release = tmp_path / "release"
    run = wfs.held.start({"key": "cancel-running", "release": str(release)})
    worker = threading.Thread(target=lambda: (drain(), connection.close()))
    worker.start()
    wait_until(
        lambda: (
            effects("cancel-running", "before")
            and SideEffect.objects.filter(
                key="cancel-running", note__startswith="hold-start"
            ).exists()
        )
    )
    assert cancel_run(run.pk)
    release.touch()
    worker.join(30)
    hold = step(run, "hold")
    assert (hold.state, hold.output, hold.claim_id) == (StepState.CANCELLED, None, None)
    assert step(run, "after_hold").state == StepState.CANCELLED
    assert effects("cancel-running", "after") == 0
    assert Job.objects.get(pk=hold.job_id).state == JobState.CANCELLED


@pytestmark_db
def test_a_stale_attempt_cannot_write_after_its_claim_was_swept():
    run = wfs.counting.start({"key": "stale"})
    items = step(run, "count_items")
    claimed = wf_store.workflow_step_claim(items.pk, 1, items.job_id)
    assert claimed is not None and claimed.attempt == 1
    assert wf_store.workflow_step_progress(items.pk, claimed.claim_id, 1)
    # The job ends without finishing the step (here: cancelled from the jobs
    # admin), and the step shows no sign of life for a while.
    assert store.job_cancel(items.job_id)
    assert wf_store.sweep_stale_steps(60, build_job=build_step_job) == []  # still fresh
    WorkflowTask.objects.filter(pk=items.pk).update(heartbeat_at="2000-01-01T00:00:00Z")
    assert wf_store.sweep_stale_steps(60, build_job=build_step_job) == [items.pk]
    assert wf_store.sweep_stale_steps(60, build_job=build_step_job) == []  # done once

    items.refresh_from_db()
    assert (items.state, items.claim_id, items.failures) == (StepState.READY, None, 1)
    assert items.errors[-1]["exception_class_path"].endswith("StepJobLost")
    # The old attempt wakes up: every write it tries is rejected.
    old = claimed.claim_id
    assert not wf_store.workflow_step_progress(items.pk, old, 99)
    assert not wf_store.workflow_step_succeed(items.pk, old, "stale", build_job=build_step_job)
    assert not wf_store.workflow_step_fail(
        items.pk, old, {"message": "x"}, None, build_job=build_step_job
    )
    items.refresh_from_db()
    assert (items.state, items.output, items.checkpoint) == (StepState.READY, None, 1)
    run = run_to_end(run)
    assert run.state == RunState.SUCCEEDED
    assert run.output == {"resumed_from": 2}  # from the first attempt's checkpoint


@pytestmark_db
def test_the_rerun_of_a_lost_job_reclaims_its_step_and_fences_the_old_attempt():
    run = wfs.three.start({"key": "reclaim"})
    fetch = step(run, "fetch")
    first = wf_store.workflow_step_claim(fetch.pk, 1, fetch.job_id)
    second = wf_store.workflow_step_claim(fetch.pk, 1, fetch.job_id)  # the job's re-run
    assert first and second and first.claim_id != second.claim_id
    assert wf_store.workflow_step_claim(fetch.pk, 1, fetch.job_id + 1000) is None  # other job
    assert wf_store.workflow_step_claim(fetch.pk, 2, fetch.job_id) is None  # other generation
    assert not wf_store.workflow_step_succeed(
        fetch.pk, first.claim_id, "old", build_job=build_step_job
    )
    assert wf_store.workflow_step_succeed(
        fetch.pk, second.claim_id, "new", build_job=build_step_job
    )
    fetch.refresh_from_db()
    assert (fetch.output, fetch.attempts, fetch.failures) == ("new", 2, 0)
    assert [e["exception_class_path"] for e in fetch.errors] == [
        "django_dispatch.exceptions.WorkerLost"
    ]
    assert step(run, "flaky_total").state == StepState.READY  # the next step was enqueued


@pytestmark_db
def test_a_job_that_ends_without_finishing_its_step_counts_as_an_attempt():
    run = wfs.gated.start({"key": "lost-jobs"})
    for _ in range(2):  # prepare has max_attempts=1: the first loss parks the run
        prepare = step(run, "prepare")
        if prepare.state != StepState.READY:
            break
        store.job_cancel(prepare.job_id)
        WorkflowTask.objects.filter(pk=prepare.pk).update(heartbeat_at="2000-01-01T00:00:00Z")
        wf_store.sweep_stale_steps(1, build_job=build_step_job)
    run.refresh_from_db()
    assert run.state == RunState.STUCK and step(run, "prepare").state == StepState.FAILED


@pytestmark_db
def test_checkpoints_are_read_back_on_the_next_attempt():
    run = run_to_end(wfs.counting.start({"key": "count"}))
    assert run.state == RunState.SUCCEEDED and run.output == {"resumed_from": 4}
    notes = SideEffect.objects.filter(key="count").order_by("id").values_list("note", flat=True)
    assert list(notes) == [f"item-{i}" for i in range(1, 6)]  # each item exactly once
    items = step(run, "count_items")
    assert (items.checkpoint, items.attempts) == (5, 2)


@pytestmark_db
def test_a_step_over_its_timeout_fails_and_parks_the_run():
    started = time.monotonic()
    run = run_to_end(wfs.slow.start({"key": "slow"}))
    assert time.monotonic() - started < 4
    too_slow = step(run, "too_slow")
    assert run.state == RunState.STUCK and too_slow.state == StepState.FAILED
    assert too_slow.errors[0]["exception_class_path"] == (
        "django_dispatch.workflows.exceptions.StepTimeout"
    )


@pytestmark_db
def test_a_child_run_completes_its_parents_step():
    parent = run_to_end(wfs.parent.start({"key": "family"}))
    assert parent.state == RunState.SUCCEEDED
    assert parent.output == {"child_result": 41}  # (20 * 2) + 1, by the child's async step
    (kid,) = children(parent.pk)
    assert kid.name == "tests.child" and kid.state == RunState.SUCCEEDED and kid.output == 41
    delegate = step(parent, "delegate")
    assert (delegate.state, delegate.output, delegate.child_run_id) == (
        StepState.SUCCEEDED,
        41,
        kid.pk,
    )
    assert kid.parent_task_id == delegate.pk
    assert list(parent.children.all()) == [kid]


@pytestmark_db
def test_cancelling_a_parent_cancels_the_child_it_waits_for():
    parent = wfs.parent.start({"key": "cascade"})
    drain(max_jobs=2)  # begin, delegate: the child is started, not yet run
    (kid,) = children(parent.pk)
    assert step(parent, "delegate").state == StepState.WAITING
    assert cancel_run(parent.pk)
    kid.refresh_from_db()
    assert kid.state == RunState.CANCELLED
    drain()
    assert effects("cascade", "child-double") == 0


@pytestmark_db
def test_a_cancelled_child_parks_its_parent_and_a_retry_starts_a_new_child():
    parent = wfs.parent.start({"key": "orphan"})
    drain(max_jobs=2)
    (kid,) = children(parent.pk)
    assert cancel_run(kid.pk)
    parent.refresh_from_db()
    delegate = step(parent, "delegate")
    assert parent.state == RunState.STUCK and delegate.state == StepState.FAILED
    assert delegate.errors[-1]["exception_class_path"].endswith("ChildRunCancelled")
    assert retry_run(parent.pk)
    parent = run_to_end(parent)
    assert parent.state == RunState.SUCCEEDED and parent.output == {"child_result": 41}
    assert [c.state for c in children(parent.pk)] == [RunState.CANCELLED, RunState.SUCCEEDED]


@pytestmark_db
def test_oldest_runnable_age_for_autoscaling():
    assert oldest_runnable_age() == 0.0
    run = wfs.three.start({"key": "age"})
    time.sleep(0.3)
    assert 0.25 <= oldest_runnable_age() < 10
    run_to_end(run)
    assert oldest_runnable_age() == 0.0


# --- real worker processes -----------------------------------------------------------------


@pytest.mark.slow
@pytestmark_db
def test_sigkill_inside_step_two_resumes_at_step_two_on_another_worker(start_worker, tmp_path):
    release = tmp_path / "release"
    run = wfs.held.start({"key": "kill", "release": str(release)})
    victim = start_worker("--concurrency", "1")
    wait_until(
        lambda: SideEffect.objects.filter(key="kill", note__startswith="hold-start").exists(),
        what="step 2 started",
    )
    victim.signal(signal.SIGKILL)
    victim.wait()
    survivor = start_worker("--concurrency", "1")
    wait_until(
        lambda: SideEffect.objects.filter(key="kill", note=f"hold-start:{survivor.pid}").exists(),
        what="step 2 resumed by the survivor",
    )
    release.touch()
    wait_until(
        lambda: WorkflowRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED,
        what="run finished",
    )
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0, survivor.output()

    run.refresh_from_db()
    assert run.output == ["before", "held"]
    assert effects("kill", "before") == 1  # step 1 did not run again
    assert [
        n
        for n in SideEffect.objects.filter(key="kill").order_by("id").values_list("note", flat=True)
        if n.startswith("hold-start")
    ] == [f"hold-start:{victim.pid}", f"hold-start:{survivor.pid}"]
    hold = step(run, "hold")
    assert (hold.attempts, hold.failures) == (2, 0)
    assert [e["exception_class_path"] for e in hold.errors] == [
        "django_dispatch.exceptions.WorkerLost"
    ]
    assert Job.objects.get(pk=hold.job_id).worker_lost_count == 1


# --- admin ------------------------------------------------------------------------------


@pytest.fixture
def wf_admin(admin_client):
    import django_dispatch.admin.workflows  # noqa: F401  (registers the ModelAdmins)

    return admin_client


@pytestmark_db
def test_admin_lists_runs_and_shows_a_runs_steps(wf_admin):
    run = run_to_end(wfs.gated.start({"key": "admin"}, idempotency_key="admin-1"))
    page = wf_admin.get("/admin/django_dispatch/workflowrun/?state=stuck")
    assert page.status_code == 200
    text = page.content.decode()
    assert "tests.gated" in text and "admin-1" in text and ">gate<" in text  # current step
    page = wf_admin.get(f"/admin/django_dispatch/workflowrun/{run.pk}/change/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "PermissionError" in text and "the gate is closed" in text and "prepared" in text
    assert wf_admin.get("/admin/django_dispatch/workflowtask/?state=failed").status_code == 200
    step_page = wf_admin.get(f"/admin/django_dispatch/workflowtask/{step(run, 'gate').pk}/change/")
    assert step_page.status_code == 200


@pytestmark_db
def test_admin_actions_call_the_operator_services(wf_admin):
    stuck = run_to_end(wfs.gated.start({"key": "admin-actions"}))
    pending = wfs.three.start({"key": "admin-pending"})
    url = "/admin/django_dispatch/workflowrun/"
    response = wf_admin.post(
        url, {"action": "retry_runs", "_selected_action": [stuck.pk, pending.pk]}, follow=True
    )
    assert "1 retried, 1 skipped" in response.content.decode()
    wf_admin.post(url, {"action": "cancel_runs", "_selected_action": [pending.pk]})
    pending.refresh_from_db()
    assert pending.state == RunState.CANCELLED
    stuck = run_to_end(stuck)  # still closed: stuck again
    assert stuck.state == RunState.STUCK
    wf_admin.post(url, {"action": "skip_current_steps", "_selected_action": [stuck.pk]})
    assert step(stuck, "gate").state == StepState.SKIPPED
    assert run_to_end(stuck).state == RunState.SUCCEEDED
    steps_url = "/admin/django_dispatch/workflowtask/"
    other = wfs.three.start({"key": "admin-skip-step"})
    wf_admin.post(
        steps_url, {"action": "skip_steps", "_selected_action": [step(other, "fetch").pk]}
    )
    assert step(other, "fetch").state == StepState.SKIPPED
    assert step(other, "flaky_total").state == StepState.READY


@pytestmark_db
def test_admin_replays_a_run_from_a_chosen_step(wf_admin):
    SideEffect.objects.create(key="admin-replay", note="open")
    run = run_to_end(wfs.gated.start({"key": "admin-replay"}))
    url = f"/admin/django_dispatch/workflowrun/{run.pk}/replay/"
    page = wf_admin.get(url)
    assert page.status_code == 200 and 'value="gate"' in page.content.decode()
    response = wf_admin.post(url, {"step": "gate", "generation": 1})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.generation == 2 and step(run, "gate").state == StepState.READY
    stale = wf_admin.post(url, {"step": "finish", "generation": 1})  # a second, stale form
    assert stale.status_code == 200 and "running" in stale.content.decode()
    assert run_to_end(run).state == RunState.SUCCEEDED
