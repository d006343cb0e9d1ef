"""Pure logic, no database: states, retry policy, settings validation."""

from datetime import UTC, datetime

import pytest

from django_dispatch.compat import TaskError, TaskResult, TaskResultStatus
from django_dispatch.conf import DispatchSettings, unknown_keys
from django_dispatch.core.retry import exponential_backoff, next_delay
from django_dispatch.core.states import TERMINAL, TRANSITIONS, JobState, can_transition, to_status
from tests.testapp.tasks import add


def test_terminal_states_have_no_way_out():
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()


def test_transitions_table_is_closed_over_the_vocabulary():
    assert set(TRANSITIONS) == set(JobState)
    assert can_transition("pending", "running")
    assert not can_transition("succeeded", "pending")
    assert not can_transition("pending", "succeeded")


def test_status_mapping():
    assert to_status("pending") == TaskResultStatus.READY
    assert to_status("running") == TaskResultStatus.RUNNING
    assert to_status("succeeded") == TaskResultStatus.SUCCESSFUL
    assert to_status("failed") == TaskResultStatus.FAILED
    assert to_status("cancelled") == TaskResultStatus.FAILED


def _result(failures: int) -> TaskResult:
    now = datetime.now(UTC)
    return TaskResult(
        task=add,
        id="1",
        status=TaskResultStatus.RUNNING,
        enqueued_at=now,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=[],
        kwargs={},
        backend="default",
        errors=[TaskError(exception_class_path="x.Y", traceback="") for _ in range(failures)],
        worker_ids=["w"] * failures,
    )


def test_exponential_backoff_grows_and_is_capped():
    for failures, ceiling in [(1, 1), (2, 2), (5, 16), (30, 3600)]:
        delays = [exponential_backoff(ValueError(), _result(failures)) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered


def test_next_delay_stops_at_max_attempts_and_on_none():
    def ten(exc, result):
        return 10

    def stop(exc, result):
        return None

    common = {"exception": ValueError(), "task_result": _result(1)}
    assert next_delay(attempts=1, max_attempts=3, backoff=ten, **common) == 10
    assert next_delay(attempts=3, max_attempts=3, backoff=ten, **common) is None
    assert next_delay(attempts=1, max_attempts=3, backoff=stop, **common) is None
    assert next_delay(attempts=1, max_attempts=3, backoff=lambda e, r: -5, **common) == 0


def test_settings_validation_rejects_slow_heartbeat():
    problems = DispatchSettings(LEASE_SECONDS=10, HEARTBEAT_INTERVAL=5).validate()
    assert any("HEARTBEAT_INTERVAL" in p and "third" in p for p in problems)
    assert DispatchSettings().validate() == []
    assert DispatchSettings(POLL_INTERVAL=0).validate()


def test_settings_validation_checks_types():
    problems = DispatchSettings(POLL_INTERVAL="1", LISTEN="yes").validate()  # type: ignore[arg-type]
    assert any("POLL_INTERVAL" in p and "number" in p for p in problems)
    assert any("LISTEN" in p and "True or False" in p for p in problems)


def test_settings_validation_whole_numbers_and_stale_workers():
    problems = DispatchSettings(CONCURRENCY=2.5, WORKER_STALE_SECONDS=1).validate()
    assert any("CONCURRENCY" in p and "whole number" in p for p in problems)
    assert any("WORKER_STALE_SECONDS" in p for p in problems)


def test_unknown_setting_keys_are_reported():
    assert unknown_keys({"LEASE_SECONDS": 1, "LEASE_SECOND": 1}) == ["LEASE_SECOND"]


@pytest.mark.parametrize("state", list(JobState))
def test_every_state_maps_to_a_status(state):
    assert to_status(state) in TaskResultStatus


def _row(**changes):
    row = {
        "task_path": "tests.testapp.tasks.add",
        "priority": 0,
        "queue_name": "default",
        "deferred_until": None,
        "backend": "default",
        "partition_key": None,
        "idempotency_key": None,
        "concurrency_key": None,
    }
    return {**row, **changes}


def test_rows_with_the_same_options_share_one_rebuilt_task():
    from django_dispatch.tasks.task import task_for_row

    first = task_for_row(_row())
    assert task_for_row(_row()) is first
    assert first.func is add.func and first.queue_name == "default"
    other = task_for_row(_row(priority=7, queue_name="emails"))
    assert other is not first
    assert (other.priority, other.queue_name) == (7, "emails")


def test_rows_with_keys_or_a_deferral_get_a_task_of_their_own():
    from django_dispatch.tasks.task import task_for_row

    when = datetime(2030, 1, 1, tzinfo=UTC)
    for changes in ({"partition_key": "p"}, {"idempotency_key": "k"}, {"deferred_until": when}):
        a, b = task_for_row(_row(**changes)), task_for_row(_row(**changes))
        assert a is not b and a == b
    assert task_for_row(_row(partition_key="p")).partition_key == "p"
    assert task_for_row(_row(deferred_until=when)).run_after == when


def test_a_task_replaced_at_its_path_is_rebuilt_not_served_from_the_cache(monkeypatch):
    from django_dispatch.tasks.task import task_for_row
    from tests.testapp import tasks

    assert task_for_row(_row()).func is add.func
    monkeypatch.setattr(tasks, "add", tasks.echo)
    assert task_for_row(_row()).func is tasks.echo.func


def test_argument_check_remembers_shapes_that_bound_and_still_refuses_others():
    from django_dispatch.exceptions import InvalidTaskArguments
    from django_dispatch.tasks.task import _BOUND, check_arguments

    check_arguments(add, [1, 2], {})
    assert (add.func, False, 2, ()) in _BOUND
    check_arguments(add, [3, 4], {})  # same shape, other values
    check_arguments(add, [1], {"b": 2})
    for args, kwargs in (([1], {}), ([1, 2, 3], {}), ([1], {"c": 2})):
        with pytest.raises(InvalidTaskArguments):
            check_arguments(add, args, kwargs)
    # A hand-written row's malformed kwargs never match a remembered shape.
    for kwargs in (None, [], [("b", 2)]):
        with pytest.raises(InvalidTaskArguments):
            check_arguments(add, [1, 2], kwargs)
