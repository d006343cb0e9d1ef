"""Logs: every outcome that is not a success is one record, with its fields as ``extra``.

In-process workers (``django_dispatch.testing.drain``) are read with
``caplog``; where a real process is the point (a worker killed mid-job, a
shutdown that hands a job back, start and stop lines) the worker logs JSON
lines (``tests.settings_jsonlog``, the documented ``LOGGING`` example) and
the test reads its fields from its output.
"""

from __future__ import annotations

import json
import logging
import signal
import time

import pytest
from django.db import connections
from django.test import override_settings

from django_dispatch import cancel, store
from django_dispatch.models import Job
from django_dispatch.testing import drain
from tests.conftest import postgres_only, wait_until
from tests.testapp import fault_tasks, observability_tasks, tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = (
    "dispatch_job_id",
    "dispatch_task",
    "dispatch_queue",
    "dispatch_attempt",
    "dispatch_worker_id",
    "dispatch_outcome",
)


def outcome_records(caplog, job_id) -> list[logging.LogRecord]:
    """The outcome records about one job (records that carry ``dispatch_outcome``)."""
    return [
        r
        for r in caplog.records
        if getattr(r, "dispatch_job_id", None) == int(job_id) and hasattr(r, "dispatch_outcome")
    ]


def only_record(caplog, job_id) -> logging.LogRecord:
    records = outcome_records(caplog, job_id)
    assert len(records) == 1, [r.getMessage() for r in records]
    record = records[0]
    for name in FIELDS:
        assert getattr(record, name) is not None, name
    return record


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO, logger="django_dispatch")
    return caplog


def test_a_failed_job_is_one_error_with_its_fields_and_traceback(logs):
    result = tasks.fail_always.enqueue("boom")
    drain()
    record = only_record(logs, result.id)
    assert record.levelno == logging.ERROR
    assert record.dispatch_outcome == "failed"
    assert record.dispatch_error_class == "builtins.ValueError"
    assert record.dispatch_error == "boom"
    assert record.dispatch_task == "tests.testapp.tasks.fail_always"
    assert record.dispatch_queue == "default"
    assert record.dispatch_attempt == 1
    assert record.dispatch_worker_id == "test-worker"
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert f"job {result.id} " in record.getMessage()


def test_each_retry_is_one_warning_and_the_success_is_silent(logs):
    result = tasks.fail_twice.enqueue("retry-logs")
    drain()
    assert tasks.fail_twice.get_result(result.id).status == "SUCCESSFUL"
    records = outcome_records(logs, result.id)
    assert [(r.levelno, r.dispatch_outcome, r.dispatch_attempt) for r in records] == [
        (logging.WARNING, "retried", 1),
        (logging.WARNING, "retried", 2),
    ]
    assert {r.dispatch_error_class for r in records} == {"builtins.RuntimeError"}
    assert all("retrying in" in r.getMessage() for r in records)


def test_an_unknown_task_is_logged(logs):
    """Before: a job failed as UnknownTask printed nothing at all."""
    [job] = store.jobs_insert([Job(task_path="tests.testapp.tasks.no_such_task")], db="default")
    drain()
    record = only_record(logs, job.pk)
    assert record.levelno == logging.ERROR
    assert record.dispatch_outcome == "failed"
    assert record.dispatch_error_class == "django_dispatch.exceptions.UnknownTask"
    assert record.dispatch_task == "tests.testapp.tasks.no_such_task"


def test_arguments_that_do_not_fit_are_logged(logs):
    [job] = store.jobs_insert(
        [Job(task_path="tests.testapp.tasks.add", args=[1, 2, 3])], db="default"
    )
    drain()
    record = only_record(logs, job.pk)
    assert record.levelno == logging.ERROR
    assert record.dispatch_error_class == "django_dispatch.exceptions.InvalidTaskArguments"


@override_settings(DISPATCH={"TIMEOUT_GRACE": 0.2, "LEASE_SECONDS": 2.0, "HEARTBEAT_INTERVAL": 0.3})
def test_a_timeout_is_one_record(logs):
    """In-process the worker gives up on the thread: the control loop records it."""
    result = tasks.too_slow.enqueue(1.0)  # timeout 0.5 s, then 0.2 s of grace
    drain()
    # The thread given up on finishes later; its late result is dropped silently.
    wait_until(lambda: SideEffect.objects.filter(key="too_slow").exists(), timeout=10)
    time.sleep(0.2)
    record = only_record(logs, result.id)
    assert record.levelno == logging.ERROR
    assert record.dispatch_outcome == "failed"
    assert record.dispatch_error_class == "django_dispatch.exceptions.TaskTimeout"
    assert "ran longer than its timeout" in record.getMessage()


def test_an_async_timeout_is_one_record(logs):
    result = tasks.too_slow_async.enqueue(3)
    drain()
    record = only_record(logs, result.id)
    assert record.dispatch_error_class == "django_dispatch.exceptions.TaskTimeout"


def test_a_lost_worker_is_one_warning_from_the_leader(logs):
    """A worker that claimed and vanished: the leader puts the job back and says so."""
    result = tasks.add.enqueue(1, 2)
    [claimed] = store.jobs_claim(worker_id="ghost", queues=[], limit=1, lease_seconds=0.05)
    time.sleep(0.2)  # its lease runs out
    drain()  # takes office, reclaims at once, then runs the job
    assert tasks.add.get_result(result.id).return_value == 3
    record = only_record(logs, result.id)
    assert record.levelno == logging.WARNING
    assert record.dispatch_outcome == "worker_lost"
    assert record.dispatch_error_class == "django_dispatch.exceptions.WorkerLost"
    assert record.dispatch_lost_worker_id == "ghost"
    assert record.dispatch_worker_id == "test-worker"  # who logged it: the leader
    assert record.dispatch_attempt == claimed.row["attempts"] == 1


def test_a_job_failed_by_lost_workers_is_one_error(logs):
    result = tasks.add.enqueue(1, 2)
    Job.objects.filter(pk=result.id).update(worker_lost_count=2)  # MAX_WORKER_LOST is 3
    store.jobs_claim(worker_id="ghost", queues=[], limit=1, lease_seconds=0.05)
    time.sleep(0.2)
    drain()
    record = only_record(logs, result.id)
    assert record.levelno == logging.ERROR
    assert record.dispatch_outcome == "failed"
    assert record.dispatch_error_class == "django_dispatch.exceptions.WorkerLost"


@postgres_only
def test_a_connection_cut_under_the_task_is_one_warning(logs):
    result = fault_tasks.cut_connection_once.enqueue("logs")
    drain()
    assert fault_tasks.cut_connection_once.get_result(result.id).status == "SUCCESSFUL"
    record = only_record(logs, result.id)
    assert record.levelno == logging.WARNING
    assert record.dispatch_outcome == "interrupted"
    assert record.dispatch_error_class.startswith("django.db.utils.")


def test_a_job_cancelled_while_it_runs_is_one_warning(logs, tmp_path):
    import threading

    flag = tmp_path / "go"
    result = observability_tasks.wait_for_path.enqueue("cancel-logs", str(flag))

    def run() -> None:
        try:
            drain()
        finally:
            connections.close_all()  # this thread's own, or the test database stays in use

    worker = threading.Thread(target=run)
    worker.start()
    try:
        wait_until(lambda: SideEffect.objects.filter(key="cancel-logs").exists())
        assert cancel(result.id)
        # The heartbeat finds it cancelled and asks it to stop.
        wait_until(lambda: any("asking it to stop" in r.getMessage() for r in logs.records))
    finally:
        flag.touch()
        worker.join(30)
    record = only_record(logs, result.id)
    assert record.levelno == logging.WARNING
    assert record.dispatch_outcome == "cancelled"


# --- real processes ---------------------------------------------------------------------


def json_lines(output: str) -> list[dict]:
    lines = []
    for line in output.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


JSON_LOGS = {"DJANGO_SETTINGS_MODULE": "tests.settings_jsonlog"}


@pytest.mark.slow
def test_a_real_worker_logs_start_stop_and_a_hand_back_as_json(start_worker, tmp_path):
    flag = tmp_path / "never"
    result = observability_tasks.wait_for_path.enqueue("handback", str(flag))
    worker = start_worker("--shutdown-timeout", "0.3", env=JSON_LOGS)
    wait_until(lambda: SideEffect.objects.filter(key="handback").exists(), timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    lines = json_lines(worker.output())
    started = [
        line
        for line in lines
        if line["message"].startswith("worker ") and "started" in line["message"]
    ]
    stopped = [
        line
        for line in lines
        if line["message"].startswith("worker ") and " stopped" in line["message"]
    ]
    assert len(started) == 1 and len(stopped) == 1
    assert started[0]["level"] == stopped[0]["level"] == "INFO"
    worker_id = started[0]["dispatch_worker_id"]
    assert worker_id and stopped[0]["dispatch_worker_id"] == worker_id
    [released] = [
        line
        for line in lines
        if line.get("dispatch_job_id") == int(result.id) and "dispatch_outcome" in line
    ]
    assert released["level"] == "WARNING"
    assert released["dispatch_outcome"] == "released"
    assert released["dispatch_worker_id"] == worker_id
    assert released["dispatch_task"] == "tests.testapp.observability_tasks.wait_for_path"
    assert released["dispatch_queue"] == "default"
    assert released["dispatch_attempt"] == 1
    assert "handed back" in released["message"]


@pytest.mark.slow
def test_a_worker_killed_mid_job_is_logged_by_the_next_leader(start_worker, tmp_path):
    flag = tmp_path / "later"
    result = observability_tasks.wait_for_path.enqueue("killed", str(flag))
    first = start_worker("--worker-id", "doomed", env=JSON_LOGS)
    wait_until(lambda: SideEffect.objects.filter(key="killed").exists(), timeout=30)
    first.signal(signal.SIGKILL)
    first.wait()
    flag.touch()
    second = start_worker("--worker-id", "heir", env=JSON_LOGS)
    wait_until(
        lambda: observability_tasks.wait_for_path.get_result(result.id).status == "SUCCESSFUL",
        timeout=30,
    )
    second.signal(signal.SIGTERM)
    second.wait()
    records = [
        line
        for line in json_lines(second.output())
        if line.get("dispatch_job_id") == int(result.id) and "dispatch_outcome" in line
    ]
    assert len(records) == 1, records
    [lost] = records
    assert lost["level"] == "WARNING"
    assert lost["dispatch_outcome"] == "worker_lost"
    assert lost["dispatch_lost_worker_id"] == "doomed"
    assert lost["dispatch_worker_id"] == "heir"
    assert lost["dispatch_error_class"] == "django_dispatch.exceptions.WorkerLost"
