"""The executor's classification, on its own: no database, no settings, no backend.

Every input is an argument: the claimed row, what the task raised or
returned, and the retry policy. So each case is a plain function call.
"""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from django_dispatch.compat import TaskResultStatus
from django_dispatch.exceptions import JobCancelled
from django_dispatch.runtime import executor
from django_dispatch.runtime.executor import RetryPolicy
from django_dispatch.store import ClaimedJob, Lease
from tests.testapp import tasks

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def claimed(**row: Any) -> ClaimedJob:
    values: dict[str, Any] = {
        "id": 7,
        "task_path": tasks.add.module_path,
        "backend": "default",
        "args": [1, 2],
        "kwargs": {},
        "attempts": 1,
        "max_attempts": 3,
        "worker_lost_count": 0,
        "errors": [],
        "worker_ids": ["w"],
        "enqueued_at": NOW,
        "started_at": NOW,
        "last_attempted_at": NOW,
        "partition_key": None,
        **row,
    }
    lease = Lease(job_id=values["id"], worker_id="w", epoch=1)
    return ClaimedJob(lease=lease, row=values, claimed_at=NOW)


def policy(**changes: Any) -> RetryPolicy:
    return RetryPolicy(**{"max_attempts": 3, "backoff": lambda e, r: 4.0, **changes})


def test_a_failure_within_the_budget_is_retried_after_the_policys_backoff():
    outcome = executor.classify_failure(claimed(), ValueError("x"), task=tasks.add, policy=policy())
    assert outcome.kind == "retry" and outcome.retry_in == 4.0
    assert [e["exception_class_path"] for e in outcome.errors] == ["builtins.ValueError"]
    assert outcome.task_result is not None
    assert outcome.task_result.status == TaskResultStatus.READY
    assert [e.exception_class_path for e in outcome.task_result.errors] == ["builtins.ValueError"]


def test_the_policys_attempt_budget_decides_not_the_rows():
    job = claimed(attempts=2, max_attempts=10)
    outcome = executor.classify_failure(job, ValueError("x"), task=tasks.add, policy=policy())
    assert outcome.kind == "retry"
    outcome = executor.classify_failure(
        job, ValueError("x"), task=tasks.add, policy=policy(max_attempts=2)
    )
    assert outcome.kind == "failed" and outcome.retry_in is None
    assert outcome.task_result is not None
    assert outcome.task_result.status == TaskResultStatus.FAILED


def test_attempts_lost_to_dead_workers_do_not_count():
    job = claimed(attempts=3, worker_lost_count=1)
    outcome = executor.classify_failure(job, ValueError("x"), task=tasks.add, policy=policy())
    assert outcome.kind == "retry"


def test_the_history_of_errors_is_kept():
    earlier = {"exception_class_path": "builtins.KeyError", "traceback": "tb"}
    outcome = executor.classify_failure(
        claimed(errors=[earlier]), ValueError("x"), task=tasks.add, policy=policy()
    )
    assert [e["exception_class_path"] for e in outcome.errors] == [
        "builtins.KeyError",
        "builtins.ValueError",
    ]


def test_no_policy_fails_for_good_within_the_budget():
    outcome = executor.classify_failure(claimed(), ValueError("x"), task=tasks.add, policy=None)
    assert outcome.kind == "failed" and outcome.retry_in is None
    assert outcome.task_result is not None
    assert outcome.task_result.status == TaskResultStatus.FAILED


def test_without_a_task_there_is_no_result_and_no_retry():
    outcome = executor.classify_failure(claimed(), ValueError("x"), task=None, policy=policy())
    assert outcome.kind == "failed" and outcome.task_result is None


def test_a_backoff_of_none_means_no_retry():
    outcome = executor.classify_failure(
        claimed(), ValueError("x"), task=tasks.add, policy=policy(backoff=lambda e, r: None)
    )
    assert outcome.kind == "failed"


def test_a_backoff_that_raises_falls_back_to_the_default(caplog):
    def broken(exception, result):
        raise RuntimeError("bug in the backoff")

    outcome = executor.classify_failure(
        claimed(), ValueError("x"), task=tasks.add, policy=policy(backoff=broken)
    )
    assert outcome.kind == "retry" and outcome.retry_in is not None and outcome.retry_in > 0
    assert "backoff function failed" in caplog.text


def _error(error: BaseException, **flags: Any) -> executor.Outcome:
    job = claimed()
    result = executor.running_result(job, tasks.add)
    kwargs: dict[str, Any] = {
        "stop_asked": False,
        "cancelled_error": False,
        "connection_lost": False,
        "policy": policy(),
        **flags,
    }
    return executor.classify_error(job, error, task=tasks.add, result=result, **kwargs)


def test_a_stop_the_worker_asked_for_discards_the_attempt():
    error = JobCancelled("stop")
    outcome = _error(error, stop_asked=True, cancelled_error=True)
    assert outcome.kind == "discarded" and outcome.exception is error


def test_a_cancellation_the_task_raised_on_its_own_is_an_error():
    outcome = _error(JobCancelled("mine"), cancelled_error=True)
    assert outcome.kind == "retry"


def test_a_lost_connection_runs_again_without_spending_an_attempt():
    outcome = _error(OSError("gone"), connection_lost=True)
    assert outcome.kind == "interrupted" and outcome.retry_in == 1.0  # 0.5 * 2**1
    assert outcome.task_result is None


def test_a_lost_connection_past_the_lost_worker_budget_fails_for_good():
    outcome = _error(OSError("gone"), connection_lost=True, policy=policy(max_worker_lost=1))
    assert outcome.kind == "failed"


def test_a_lost_connection_without_retry_on_connection_loss_is_an_ordinary_failure():
    outcome = _error(
        OSError("gone"), connection_lost=True, policy=policy(retry_on_connection_loss=False)
    )
    assert outcome.kind == "retry" and outcome.retry_in == 4.0


def test_a_returned_value_succeeds():
    job = claimed()
    result = executor.running_result(job, tasks.add)
    assert result.status == TaskResultStatus.RUNNING
    outcome = executor.succeeded(result, 3)
    assert outcome.kind == "succeeded" and outcome.return_value == 3
    assert outcome.task_result is result and result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3


@pytest.mark.parametrize(
    "forbidden", ["conf", "backend", "enqueue", "tasks.enqueue", "tasks.registry", "django.db"]
)
def test_the_executor_reads_no_settings_and_looks_up_no_backend(forbidden):
    source = Path(executor.__file__).read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            imported.add(module.lstrip(".") if node.level else module)
            imported.update(f"{module}.{a.name}".lstrip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert not {name for name in imported if name == forbidden or name.startswith(forbidden + ".")}
