"""Database faults are not the job's failure (issue: a restart must never fail a job).

Real ``rundispatch`` processes on real PostgreSQL; connections are cut with
``pg_terminate_backend``, which is what a server restart, a failover or a
PgBouncer restart does to every client socket. (The chaos suite in
``tests/chaos/`` crashes and restarts a whole server.)
"""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from django_dispatch import enqueue_many
from django_dispatch.compat import TaskResultStatus
from django_dispatch.core.states import JobState
from django_dispatch.models import DeadLetter, Job
from tests.conftest import postgres_only, wait_until
from tests.testapp import fault_tasks, tasks
from tests.testapp.models import Execution, SideEffect

pytestmark = [postgres_only, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _cut_every_other_connection() -> int:
    """Terminate every backend of the test database but this test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def _finished() -> int:
    return Job.objects.filter(state__in=[JobState.SUCCEEDED, JobState.FAILED]).count()


@pytest.mark.parametrize("listen", [True, False], ids=["listen", "polling"])
def test_idle_workers_whose_connections_broke_fail_no_job(start_worker, listen):
    worker = start_worker("--concurrency", "4", overrides={"LISTEN": listen})
    # Warm up every job thread, so that each holds a connection of its own.
    enqueue_many(tasks.sleep_then_record, [((f"warm-{i}", 0.2), {}) for i in range(8)])
    wait_until(lambda: _finished() == 8, timeout=60, what="the warm-up jobs")
    assert SideEffect.objects.filter(note="end").values("worker_pid").distinct().count() == 1

    assert _cut_every_other_connection() >= 5  # 4 job threads + the control loop
    enqueue_many(tasks.record, [((f"job-{i}",), {}) for i in range(200)])
    wait_until(lambda: _finished() == 208, timeout=60, what="200 jobs after the cut")

    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == 208, worker.output()
    assert not DeadLetter.objects.exists()
    assert Execution.objects.count() == 200  # unique keys: each job's effect landed once
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert worker.popen.poll() is None
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_connection_cut_under_task_code_runs_the_job_again_without_an_attempt(start_worker):
    result = fault_tasks.cut_connection_once.enqueue("once")  # max_attempts=1
    worker = start_worker("--concurrency", "2")
    wait_until(
        lambda: fault_tasks.cut_connection_once.get_result(result.id).is_finished, timeout=30
    )
    final = fault_tasks.cut_connection_once.get_result(result.id)
    assert final.status == TaskResultStatus.SUCCESSFUL, worker.output()
    job = Job.objects.get(pk=result.id)
    assert job.worker_lost_count == 1 and job.attempts == 2
    assert [e["exception_class_path"] for e in job.errors] == ["django.db.utils.OperationalError"]
    assert SideEffect.objects.filter(key="once").count() == 2
    worker.wait_for_output("without spending an attempt")


def test_a_job_that_keeps_cutting_its_connection_is_failed_after_the_lost_budget(start_worker):
    result = fault_tasks.cut_connection_always.enqueue("always")
    start_worker("--concurrency", "1", overrides={"MAX_WORKER_LOST": 2})
    wait_until(
        lambda: fault_tasks.cut_connection_always.get_result(result.id).is_finished, timeout=30
    )
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.FAILED
    assert SideEffect.objects.filter(key="always").count() == 2
    assert job.worker_lost_count == 1  # the first run was interrupted, the second failed it
    assert DeadLetter.objects.filter(job_id=job.pk).exists()


def test_connection_loss_is_an_ordinary_failure_when_the_site_says_so(start_worker):
    result = fault_tasks.cut_connection_once.enqueue("strict")
    start_worker("--concurrency", "1", overrides={"RETRY_ON_CONNECTION_LOSS": False})
    wait_until(
        lambda: fault_tasks.cut_connection_once.get_result(result.id).is_finished, timeout=30
    )
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.FAILED and job.attempts == 1 and job.worker_lost_count == 0


def test_the_tasks_own_database_error_spends_its_attempt(start_worker):
    result = fault_tasks.bad_sql.enqueue("mine")
    start_worker("--concurrency", "1")
    wait_until(lambda: fault_tasks.bad_sql.get_result(result.id).is_finished, timeout=30)
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.FAILED and job.attempts == 1 and job.worker_lost_count == 0
    assert job.errors[0]["exception_class_path"] == "django.db.utils.ProgrammingError"
