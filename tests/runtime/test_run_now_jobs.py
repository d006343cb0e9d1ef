"""``django_dispatch.run_now(result_id)``: one job claimed by id and run in the caller's
process through the worker's own path, honouring what a claim honours.

Tasks record SideEffect rows with the pid of the process that ran them, so
"here" means this test process's pid; a real worker process (``start_worker``)
races the callers where a worker is involved.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_dispatch import pause_queue, resume_queue, run_now, usage
from django_dispatch.compat import TaskResultDoesNotExist
from django_dispatch.models import DeadLetter, Job, Worker
from django_dispatch.runtime.inline import INLINE_WORKER_PREFIX
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from tests.conftest import wait_until
from tests.testapp import flow_tasks, resource_tasks, tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def pids(key: str) -> list[int]:
    return list(SideEffect.objects.filter(key=key).values_list("worker_pid", flat=True))


def job(result) -> Job:
    return Job.objects.get(pk=int(result.id))


def test_run_now_runs_a_pending_job_here_through_the_worker_path():
    result = flow_tasks.mark.enqueue("here")
    assert run_now(result.id) is True
    assert pids("here") == [os.getpid()]
    row = job(result)
    assert (row.state, row.attempts, row.lease_expires_at) == (JobState.SUCCEEDED, 1, None)
    assert len(row.worker_ids) == 1 and row.worker_ids[0].startswith(INLINE_WORKER_PREFIX)
    assert flow_tasks.mark.get_result(result.id).return_value == "here"
    record = next(r for r in usage.records(flow_tasks.mark) if r.job_id == row.pk)
    assert (record.worker_id, record.outcome) == (row.worker_ids[0], "succeeded")
    assert not Worker.objects.exists()  # the short-lived worker row is gone
    assert run_now(result.id) is False  # finished: not claimable, not run again
    assert run_now(int(result.id)) is False  # the int id works too
    assert pids("here") == [os.getpid()]


def test_a_job_deferred_to_later_runs_now():
    later = timezone.now() + timedelta(hours=1)
    result = flow_tasks.mark.using(run_after=later).enqueue("deferred")
    assert drain() == 0  # not due for a worker
    assert run_now(result.id) is True
    assert pids("deferred") == [os.getpid()]
    assert job(result).state == JobState.SUCCEEDED


def test_a_failing_job_is_retried_then_dead_lettered_as_on_a_worker():
    result = resource_tasks.fails.enqueue("no")  # max_attempts=2
    assert run_now(result.id) is True
    row = job(result)
    assert (row.state, row.attempts) == (JobState.PENDING, 1)  # a retry, scheduled
    assert row.errors[-1]["message"] == "no"
    assert run_now(result.id) is True  # the retry's backoff is not waited out
    row = job(result)
    assert (row.state, row.attempts) == (JobState.FAILED, 2)
    assert DeadLetter.objects.filter(job_id=row.pk).count() == 1
    assert run_now(result.id) is False


def test_a_job_with_resource_needs_runs_here_too():
    result = flow_tasks.mark.using(resources={"gpu": 1}, locality="eu").enqueue("gpu")
    assert drain() == 0  # no worker without capacity takes it
    assert run_now(result.id) is True
    assert pids("gpu") == [os.getpid()]


def test_bad_input_and_a_transaction_are_refused_and_nothing_runs():
    result = flow_tasks.mark.enqueue("bad")
    for bad in (None, True, 1.5, ["1"]):
        with pytest.raises(TypeError, match="run_now\\(\\) takes a job's result id"):
            run_now(bad)  # type: ignore[arg-type]
    for bad in ("abc", "", "-3", "0", " 12", "1_2", "\u0661\u0662"):
        with pytest.raises(ValueError, match="result id"):
            run_now(bad)
    with pytest.raises(TaskResultDoesNotExist, match="no job 987654321"):
        run_now("987654321")
    with pytest.raises(ValueError, match="no DispatchBackend alias 'nope'"):
        run_now(result.id, backend="nope")
    with (
        transaction.atomic(),
        pytest.raises(transaction.TransactionManagementError, match="on_commit"),
    ):
        run_now(result.id)
    row = job(result)
    assert (row.state, row.attempts, row.worker_id) == (JobState.PENDING, 0, None)
    assert pids("bad") == [] and not Worker.objects.exists()
    assert run_now(result.id) is True  # the same call outside it runs the job


def test_a_job_of_another_namespace_is_refused():
    other = {
        **settings.TASKS,
        "other": {
            "BACKEND": "django_dispatch.backend.DispatchBackend",
            "QUEUES": [],
            "OPTIONS": {"NAMESPACE": "other"},
        },
    }
    with override_settings(TASKS=other):
        result = flow_tasks.mark.enqueue("ns")
        with pytest.raises(ValueError, match=r"belongs to namespace ''.*backend="):
            run_now(result.id, backend="other")
    assert pids("ns") == []
    assert run_now(result.id) is True


def test_a_job_in_a_paused_queue_is_left_alone():
    result = flow_tasks.mark.enqueue("paused")
    assert pause_queue("default") is True
    assert run_now(result.id) is False
    assert job(result).state == JobState.PENDING and pids("paused") == []
    assert resume_queue("default") is True
    assert run_now(result.id) is True


def _in_thread(target) -> threading.Thread:
    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_partitions_run_in_order_one_at_a_time(tmp_path: Path):
    go = tmp_path / "go"
    first = tasks.wait_for_file.using(partition_key="p").enqueue("p1", str(go))
    second = flow_tasks.mark.using(partition_key="p").enqueue("p2")
    assert run_now(second.id) is False  # behind its head
    assert job(second).state in (JobState.PENDING, JobState.BLOCKED)
    holder = _in_thread(lambda: run_now(first.id))
    wait_until(lambda: pids("p1"), what="the head to start")
    assert run_now(second.id) is False  # its key's head runs
    go.touch()
    holder.join(30)
    assert job(first).state == JobState.SUCCEEDED
    assert run_now(second.id) is True  # promoted when the head finished: its turn
    assert pids("p2") == [os.getpid()]


def test_a_queue_at_its_concurrency_limit_holds_the_job(tmp_path: Path):
    go = tmp_path / "go"
    limited = {**settings.DISPATCH, "QUEUES": {"default": {"concurrency": 1}}}
    with override_settings(DISPATCH=limited):
        holding = tasks.wait_for_file.enqueue("q1", str(go))
        waiting = flow_tasks.mark.enqueue("q2")
        holder = _in_thread(lambda: run_now(holding.id))
        wait_until(lambda: pids("q1"), what="the first job to start")
        assert run_now(waiting.id) is False  # the queue's one slot is taken
        assert job(waiting).state == JobState.BLOCKED  # set aside, as a claim does
        go.touch()
        holder.join(30)
        assert run_now(waiting.id) is False  # blocked until a claim promotes it
        assert drain() == 1  # the claim promotes it and runs it
    assert pids("q2") == [os.getpid()] and job(waiting).state == JobState.SUCCEEDED


def test_a_task_at_its_concurrency_limit_holds_the_job():
    results = [flow_tasks.capped_two.using(concurrency_key="k").enqueue(i) for i in range(3)]
    # two of the group run (held by a fake lease of another worker), the third must wait
    Job.objects.filter(pk__in=[int(r.id) for r in results[:2]]).update(
        state=JobState.RUNNING,
        worker_id="elsewhere",
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )
    assert run_now(results[2].id) is False
    assert job(results[2]).state == JobState.BLOCKED
    Job.objects.filter(pk=int(results[0].id)).update(state=JobState.PENDING, worker_id=None)
    assert run_now(results[0].id) is True  # it was already counted: room for one again


@pytest.mark.slow
def test_run_now_racing_a_worker_process_runs_every_job_exactly_once(start_worker):
    """Three threads call run_now on every job while a real worker process claims the
    same jobs: each job runs exactly once, and each run_now reports only what it ran."""
    start_worker("--concurrency", "2")
    wait_until(lambda: Worker.objects.exists(), timeout=60, what="the worker to start")
    results = []
    ran: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            start.wait(timeout=60)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                busy = [
                    r for r in results if job(r).state not in (JobState.SUCCEEDED, JobState.FAILED)
                ]
                if not busy:
                    return
                for result in busy:
                    if run_now(result.id):
                        with lock:
                            ran.append(result.id)
        except BaseException as e:  # reported by the test thread
            errors.append(e)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for thread in threads:
        thread.start()
    with transaction.atomic():  # the worker (woken at commit) and the callers start together
        # 50 ms each: the worker alone needs a second for them, so the callers meet it
        results.extend(flow_tasks.mark.enqueue(f"race-{i}", 0.05) for i in range(40))
    start.wait(timeout=60)
    for thread in threads:
        thread.join(90)
    assert not errors, errors
    here = os.getpid()
    inline = 0
    for i, result in enumerate(results):
        ran_by = pids(f"race-{i}")
        assert len(ran_by) == 1, (i, ran_by)  # exactly once
        inline += ran_by[0] == here
        assert job(result).state == JobState.SUCCEEDED and job(result).attempts == 1
    assert len(ran) == len(set(ran)) == inline  # each inline run reported once, by its caller
    assert 0 < inline < len(results)  # both the callers and the worker took jobs
