"""The django.tasks backend: enqueue, get_result, validation, transactions."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_dispatch import enqueue_many, task
from django_dispatch.backend import DispatchBackend, DispatchTask
from django_dispatch.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from django_dispatch.exceptions import InvalidTaskArguments
from django_dispatch.models import Job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_backend_capabilities_and_task_class():
    backend = task_backends["default"]
    assert isinstance(backend, DispatchBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task
    assert isinstance(tasks.add, DispatchTask)
    assert tasks.too_slow.timeout == 0.5 and tasks.fail_twice.max_attempts == 3


def test_enqueue_returns_what_get_result_returns():
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at is not None and result.started_at is None
    assert result.errors == [] and result.worker_ids == []
    assert result.args == [2, 3] and result.kwargs == {}
    assert result.backend == "default"
    fetched = tasks.add.get_result(result.id)
    assert fetched == result
    assert fetched.enqueued_at == result.enqueued_at  # from the database, both times


def test_json_round_trip_is_applied_to_args():
    result = tasks.echo.enqueue([1, (2, 3)])
    assert result.args == [[1, [2, 3]]]
    assert tasks.echo.get_result(result.id) == result


def test_using_options_round_trip():
    when = timezone.now() + timedelta(hours=1)
    configured = tasks.add.using(
        priority=7, queue_name="other", run_after=when, partition_key="p:1", idempotency_key="k1"
    )
    result = configured.enqueue(1, 2)
    job = Job.objects.get(pk=result.id)
    assert (job.priority, job.queue_name, job.partition_key, job.idempotency_key) == (
        7,
        "other",
        "p:1",
        "k1",
    )
    assert job.run_after == when and job.deferred_until == when
    fetched = tasks.add.get_result(result.id)
    assert fetched == result
    assert fetched.task.run_after == when and fetched.task.partition_key == "p:1"


def test_get_result_unknown_and_mismatch():
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("999999")
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("not-a-number")
    result = tasks.add.enqueue(1, 1)
    with pytest.raises(TaskResultMismatch):
        tasks.echo.get_result(result.id)


def test_enqueue_sends_signal():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id))

    task_enqueued.connect(receiver)
    try:
        result = tasks.add.enqueue(1, 1)
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [(DispatchBackend, result.id)]


def test_failing_enqueue_receiver_does_not_break_enqueue():
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver bug")

    task_enqueued.connect(broken)
    try:
        result = tasks.add.enqueue(1, 1)
    finally:
        task_enqueued.disconnect(broken)
    assert Job.objects.filter(pk=result.id).exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_rolled_back_atomic_never_exists():
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert Job.objects.filter(pk=result.id).exists()  # visible inside
        raise Rollback
    assert not Job.objects.filter(pk=result.id).exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_rolled_back_savepoint_is_removed():
    with transaction.atomic():
        kept = tasks.add.enqueue(1, 2)
        try:
            with transaction.atomic():
                dropped = tasks.add.enqueue(3, 4)
                raise ValueError
        except ValueError:
            pass
    assert Job.objects.filter(pk=kept.id).exists()
    assert not Job.objects.filter(pk=dropped.id).exists()


# --- bad input: a clear exception, nothing written ----------------------------


def _assert_nothing_written():
    assert Job.objects.count() == 0


def test_non_json_arguments_are_rejected():
    with pytest.raises(InvalidTaskArguments, match="JSON-serializable"):
        tasks.echo.enqueue(object())
    with pytest.raises(InvalidTaskArguments, match="JSON-serializable"):
        tasks.echo.enqueue(float("nan"))
    with pytest.raises(InvalidTaskArguments, match="JSON-serializable"):
        tasks.echo.enqueue(value={1, 2})
    _assert_nothing_written()


def test_arguments_that_do_not_fit_the_function_are_rejected():
    with pytest.raises(InvalidTaskArguments, match="cannot be called"):
        tasks.add.enqueue(1)
    with pytest.raises(InvalidTaskArguments, match="cannot be called"):
        tasks.add.enqueue(1, 2, c=3)
    _assert_nothing_written()


@override_settings(
    TASKS={"default": {"BACKEND": "django_dispatch.backend.DispatchBackend", "QUEUES": ["default"]}}
)
def test_unknown_queue_is_rejected_at_enqueue_even_if_valid_at_definition():
    # tasks.echo was defined (and validated) under QUEUES=[] with queue "emails";
    # settings changed since, so enqueue validates again.
    with pytest.raises(InvalidTask, match="emails"):
        tasks.echo.enqueue("x")
    _assert_nothing_written()


def test_priority_out_of_range_is_rejected():
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=101).enqueue(1, 2)
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=-101).enqueue(1, 2)
    _assert_nothing_written()


@override_settings(USE_TZ=True)
def test_naive_run_after_is_rejected():
    naive = timezone.now().replace(tzinfo=None)
    with pytest.raises(InvalidTask, match="aware"):
        tasks.add.using(run_after=naive).enqueue(1, 2)
    _assert_nothing_written()


def test_function_not_at_module_level_is_rejected():
    with pytest.raises(InvalidTask, match="module level"):

        @task
        def inner():
            pass

    _assert_nothing_written()


def test_bad_task_options_are_rejected_at_definition():
    for options, match in [
        ({"max_attempts": 0}, "max_attempts"),
        ({"timeout": -1}, "timeout"),
        ({"backoff": 5}, "backoff"),
    ]:
        with pytest.raises(InvalidTask, match=match):
            task(**options)(tasks.not_a_task)
    with pytest.raises(InvalidTask, match="partition_key"):
        tasks.add.using(partition_key="x" * 300)


def test_plain_task_without_options_uses_backend_defaults():
    result = tasks.add.enqueue(1, 2)
    assert Job.objects.get(pk=result.id).max_attempts == 1


# --- enqueue_many ---------------------------------------------------------------


def test_enqueue_many_returns_results_in_input_order():
    results = enqueue_many(tasks.add, [((i, i), {}) for i in range(10)], return_results=True)
    assert [r.args for r in results] == [[i, i] for i in range(10)]
    ids = [int(r.id) for r in results]
    assert ids == sorted(ids)
    assert [tasks.add.get_result(r.id) for r in results] == results


def test_enqueue_many_rejects_whole_batch_naming_the_bad_call():
    calls = [((1, 2), {}), ((1, object()), {}), ((3, 4), {})]
    with pytest.raises(InvalidTaskArguments, match="call #1"):
        enqueue_many(tasks.add, calls)
    with pytest.raises(InvalidTask, match="call #0 must be a pair"):
        enqueue_many(tasks.add, [(1, 2, 3)])
    _assert_nothing_written()
