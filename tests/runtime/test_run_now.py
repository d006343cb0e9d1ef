"""``run_now(run_id)``: the caller's process claims a run's next runnable step job by
id and runs it inline, through the worker's own path.

Steps record SideEffect rows with the pid of the process that ran them, so
"inline" means this test process's pid; real worker processes (``start_worker``)
race it where a worker is involved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test import override_settings

from django_dispatch import events, pause_queue, resume_queue, usage
from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import DeadLetter, Job, Worker, WorkflowRun, WorkflowTask
from django_dispatch.runtime.inline import INLINE_WORKER_PREFIX
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from django_dispatch.workflows import run_now
from tests.conftest import ROOT, wait_until
from tests.testapp import run_now_workflows as wfs
from tests.testapp import wait_workflows
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

RUN_STEP = "django_dispatch.workflows.tasks.run_step"


def step_of(run: WorkflowRun, name: str) -> WorkflowTask:
    return WorkflowTask.objects.get(run=run, name=name)


def marks(key: str, note: str) -> list[int]:
    """The pids of the processes that recorded ``note`` for ``key``."""
    return list(SideEffect.objects.filter(key=key, note=note).values_list("worker_pid", flat=True))


def state_of(run: WorkflowRun) -> str:
    return WorkflowRun.objects.get(pk=run.pk).state


def test_run_now_runs_the_next_step_inline_without_any_worker():
    run = wfs.two.start({"key": "inline"}, context={"request_id": "req-7"})
    first = step_of(run, "first")
    assert run_now(run.pk) == [first.job_id]
    # ran here, once, and the run moved on: the next step waits for a worker
    assert marks("inline", "first") == [os.getpid()]
    assert step_of(run, "first").state == StepState.SUCCEEDED
    assert step_of(run, "first").output == {"call_context": {"request_id": "req-7"}}
    second = step_of(run, "second")
    assert second.state == StepState.READY and marks("inline", "second") == []
    assert Job.objects.get(pk=second.job_id).state == JobState.PENDING
    assert state_of(run) == RunState.RUNNING
    # the job was run under a worker's lease by a short-lived, recognisable worker
    job = Job.objects.get(pk=first.job_id)
    assert job.state == JobState.SUCCEEDED and job.attempts == 1
    assert len(job.worker_ids) == 1 and job.worker_ids[0].startswith(INLINE_WORKER_PREFIX)
    assert job.lease_expires_at is None
    assert not Worker.objects.exists()  # deregistered on the way out
    # its usage record, as a worker writes one
    record = next(r for r in usage.records(RUN_STEP) if r.job_id == first.job_id)
    assert record.worker_id == job.worker_ids[0] and record.outcome == "succeeded"
    # the last step: the run is done, and then there is nothing left to run
    assert run_now(run.pk) == [second.job_id]
    assert marks("inline", "second") == [os.getpid()]
    assert state_of(run) == RunState.SUCCEEDED
    assert run_now(run.pk) == []
    assert SideEffect.objects.filter(key="inline").count() == 2


def test_a_failing_step_inline_is_retried_then_parks_exactly_as_on_a_worker():
    inline = wfs.failing.start({"key": "inline"})
    on_worker = wfs.failing.start({"key": "worker"})
    first_job = step_of(inline, "boom").job_id
    assert run_now(inline.pk) == [first_job]
    assert drain(include_retries=False) == 1  # the other run's first attempt, on a worker
    for run in (inline, on_worker):  # the same retry, scheduled by the same store writes
        step = step_of(run, "boom")
        assert (step.state, step.attempts, step.failures) == (StepState.READY, 1, 1)
        assert step.errors[-1]["message"] == "boom (attempt 1)"
        retry = Job.objects.get(pk=step.job_id)
        assert retry.state == JobState.SCHEDULED
        assert Job.objects.filter(pk=retry.pk, run_after__gt=Now()).exists()  # 1 h backoff
        assert state_of(run) == RunState.RUNNING
    assert drain(include_retries=False) == 0  # nothing due for a worker
    # run_now does not wait out the backoff: the second (last) attempt runs now, and parks
    retry_id = step_of(inline, "boom").job_id
    assert run_now(inline.pk) == [retry_id]
    step = step_of(inline, "boom")
    assert (step.state, step.attempts, step.failures) == (StepState.FAILED, 2, 2)
    assert state_of(inline) == RunState.STUCK
    assert marks("inline", "boom") == [os.getpid(), os.getpid()]
    assert run_now(inline.pk) == []  # stuck: nothing runnable
    assert len(marks("inline", "boom")) == 2


def test_a_step_job_that_fails_for_good_inline_gets_its_dead_letter():
    """Job-level failures are the worker's too: a step job whose arguments no longer
    fit its task fails without a retry and is dead-lettered, as on a worker."""
    run = wfs.two.start({"key": "dead"})
    job_id = step_of(run, "first").job_id
    Job.objects.filter(pk=job_id).update(args=[])
    assert run_now(run.pk) == [job_id]
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.FAILED and job.attempts == 1
    assert "InvalidTask" in job.errors[-1]["exception_class_path"]
    assert DeadLetter.objects.filter(job_id=job_id).count() == 1
    assert marks("dead", "first") == []


def test_a_run_waiting_for_an_event_runs_nothing_until_the_event_wakes_it():
    run = wait_workflows.awaits.start({"key": "ev", "event_key": "order-1"})
    wait_job = step_of(run, "wait").job_id
    assert run_now(run.pk) == [wait_job]  # runs up to its durable wait, here
    assert step_of(run, "wait").state == StepState.WAITING
    assert run_now(run.pk) == []  # waiting: nothing to run, nothing run
    assert len(marks("ev", "started")) == 1
    events.publish("payment", {"amount": 5}, key="order-1")
    woken = step_of(run, "wait")
    assert woken.state == StepState.READY
    assert run_now(run.pk) == [woken.job_id]  # resumes with the payload
    assert marks("ev", "resumed") == [os.getpid()]
    after_job = step_of(run, "after").job_id
    assert run_now(run.pk) == [after_job]
    assert state_of(run) == RunState.SUCCEEDED
    assert step_of(run, "after").output["got"] == {"amount": 5}
    assert run_now(run.pk) == []


def test_bad_input_and_a_transaction_are_refused_and_nothing_runs():
    run = wfs.two.start({"key": "bad"})
    job_id = step_of(run, "first").job_id
    with pytest.raises(WorkflowRun.DoesNotExist, match="workflow run 123456789 does not exist"):
        run_now(123456789)
    for bad in (str(run.pk), None, True, 1.5):
        with pytest.raises(TypeError, match="run_now\\(\\) takes a workflow run's id"):
            run_now(bad)  # type: ignore[arg-type]
    with (
        transaction.atomic(),
        pytest.raises(transaction.TransactionManagementError, match="on_commit"),
    ):
        run_now(run.pk)
    assert marks("bad", "first") == []
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.attempts, job.worker_id) == (JobState.PENDING, 0, None)
    assert not Worker.objects.exists()
    assert run_now(run.pk) == [job_id]  # the same call outside it runs the step


def test_steps_of_a_paused_or_limited_queue_are_left_to_the_workers():
    """A claim by id would bypass a pause and the DISPATCH["QUEUES"] gate."""
    run = wfs.two.start({"key": "flow"})
    job_id = step_of(run, "first").job_id
    assert pause_queue("default") is True
    assert run_now(run.pk) == []
    assert resume_queue("default") is True
    limited = {**settings.DISPATCH, "QUEUES": {"default": {"concurrency": 1}}}
    with override_settings(DISPATCH=limited):
        assert run_now(run.pk) == []
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.attempts) == (JobState.PENDING, 0)
    assert marks("flow", "first") == []
    assert run_now(run.pk) == [job_id]  # neither paused nor limited any more


@pytest.mark.slow
def test_a_step_a_worker_is_running_is_not_claimed_again(start_worker):
    worker = start_worker()
    run = wfs.holds.start({"key": "held"})
    wait_until(lambda: marks("held", "started"), timeout=60, what="the worker to start the step")
    assert run_now(run.pk) == []  # at once: nothing to wait for, nothing run
    assert marks("held", "started") == [worker.popen.pid]
    assert not Worker.objects.filter(id__startswith=INLINE_WORKER_PREFIX).exists()
    SideEffect.objects.create(key="held", note="go")
    wait_until(lambda: state_of(run) == RunState.SUCCEEDED, timeout=30, what="the run to finish")
    assert marks("held", "done") == [worker.popen.pid]


@pytest.mark.slow
def test_run_now_racing_a_worker_process_runs_every_step_exactly_once(start_worker):
    """Three threads call run_now on every run while a real worker process claims the
    same steps: every step runs exactly once, and each run_now reports only what it ran.

    Which side takes which step is a race: on a loaded machine one side can take a
    whole batch. Every batch must run each step exactly once; a batch that one
    side took whole proves nothing about the race, so another follows (three at
    most), and one of them must have had both sides take steps."""
    start_worker("--concurrency", "2")
    wait_until(lambda: Worker.objects.exists(), timeout=60, what="the worker to start")
    shares = []
    for batch in range(3):
        inline, steps = _race_run_now_against_the_worker(batch)
        shares.append((inline, steps))
        if 0 < inline < steps:  # both the callers and the worker took steps
            break
    else:
        pytest.fail(f"one side took every step of each batch (inline, steps): {shares}")


def _race_run_now_against_the_worker(batch: int) -> tuple[int, int]:
    """One batch of 25 two-step runs: (steps run inline by the callers, steps)."""
    runs: list[WorkflowRun] = []
    ran: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(4)  # the callers and this thread, once the runs are committed
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            start.wait(timeout=60)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                busy = [r for r in runs if state_of(r) != RunState.SUCCEEDED]
                if not busy:
                    return
                for run in busy:
                    got = run_now(run.pk)
                    with lock:
                        ran.extend(got)
        except BaseException as e:  # reported by the test thread
            errors.append(e)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for thread in threads:
        thread.start()
    with transaction.atomic():  # the worker (woken at commit) and the callers start together
        runs.extend(wfs.two.start({"key": f"race-{batch}-{i}"}) for i in range(25))
    start.wait(timeout=60)
    for thread in threads:
        thread.join(90)
    assert not errors, errors
    assert all(state_of(r) == RunState.SUCCEEDED for r in runs)
    here = os.getpid()
    inline = 0
    for run in runs:
        key = run.input["key"]
        for note in ("first", "second"):
            pids = marks(key, note)
            assert len(pids) == 1, (key, note, pids)  # exactly once
            inline += pids[0] == here
    assert len(ran) == len(set(ran)) == inline  # each inline run reported once, by its caller
    step_jobs = WorkflowTask.objects.filter(run_id__in=[r.pk for r in runs]).values("job_id")
    assert all(
        w.startswith(INLINE_WORKER_PREFIX) == (job_id in ran)
        for job_id, ids in Job.objects.filter(task_path=RUN_STEP, id__in=step_jobs).values_list(
            "id", "worker_ids"
        )
        for w in ids
    )
    return inline, 2 * len(runs)


@pytest.mark.slow
def test_the_caller_renews_its_lease_while_a_long_step_runs(start_worker):
    """A step running three lease lengths inline beside a live leader is not taken from
    the caller: the calling thread's heartbeat keeps its lease, as a worker's loop does."""
    run = wfs.holds.start({"key": "long"})
    job_id = step_of(run, "hold").job_id
    ran: list[int] = []

    def caller() -> None:
        try:
            ran.extend(run_now(run.pk))
        finally:
            connections.close_all()

    thread = threading.Thread(target=caller)
    thread.start()
    wait_until(lambda: marks("long", "started"), timeout=30, what="the step to start")
    # then the leader: it would rescue an expired lease within a reclaim interval
    start_worker()
    wait_until(
        lambda: Worker.objects.exclude(id__startswith=INLINE_WORKER_PREFIX).exists(),
        timeout=60,
        what="the worker to start",
    )
    time.sleep(3 * settings.DISPATCH["LEASE_SECONDS"])
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.RUNNING and job.worker_lost_count == 0
    assert job.worker_id.startswith(INLINE_WORKER_PREFIX)
    assert Worker.objects.filter(id=job.worker_id).exists()  # visible while it runs
    SideEffect.objects.create(key="long", note="go")
    thread.join(30)
    assert not thread.is_alive() and ran == [job_id]
    assert marks("long", "started") == [os.getpid()] and marks("long", "done") == [os.getpid()]
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.attempts, job.worker_lost_count) == (JobState.SUCCEEDED, 1, 0)
    assert step_of(run, "hold").state == StepState.SUCCEEDED
    assert not Worker.objects.filter(id__startswith=INLINE_WORKER_PREFIX).exists()


CALLER = """
import sys
import django
django.setup()
from django_dispatch.workflows import run_now
print(run_now(int(sys.argv[1])), flush=True)
"""


@pytest.mark.slow
def test_a_caller_killed_mid_step_loses_its_lease_and_a_worker_finishes_the_step(start_worker):
    """The inline lease is a worker's: SIGKILL the calling process mid-step, and the
    leader returns the job once the lease expires (a lost-worker attempt, no attempt
    spent) and deletes the caller's stale worker row; a worker then runs the step."""
    run = wfs.holds.start({"key": "killed"})
    job_id = step_of(run, "hold").job_id
    connection.ensure_connection()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DISPATCH_DB_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONUNBUFFERED": "1",
    }
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, str(run.pk)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: marks("killed", "started"), timeout=60, what="the step to start")
        job = Job.objects.get(pk=job_id)
        assert job.state == JobState.RUNNING and job.worker_id.startswith(INLINE_WORKER_PREFIX)
        assert Worker.objects.filter(id=job.worker_id, pid=caller.pid).exists()
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
    lost_worker = job.worker_id
    SideEffect.objects.create(key="killed", note="go")
    start_worker(overrides={"WORKER_STALE_SECONDS": 1.5})
    wait_until(lambda: state_of(run) == RunState.SUCCEEDED, timeout=60, what="the run to finish")
    # the step's outcome commits first, its job's success with the worker's next wave
    wait_until(
        lambda: Job.objects.get(pk=job_id).state == JobState.SUCCEEDED,
        timeout=30,
        what="the step job to succeed",
    )
    assert len(marks("killed", "started")) == 2 and len(marks("killed", "done")) == 1
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.SUCCEEDED and job.worker_lost_count == 1
    assert lost_worker in job.errors[-1]["message"]
    assert job.worker_ids[0] == lost_worker and not job.worker_ids[-1].startswith(
        INLINE_WORKER_PREFIX
    )
    wait_until(
        lambda: not Worker.objects.filter(id=lost_worker).exists(),
        timeout=30,
        what="the leader to delete the dead caller's worker row",
    )
