"""The fast enqueue paths (issue #7) store and return exactly what the ORM path did.

``Task.enqueue()`` and ``enqueue_many()`` insert with raw SQL on PostgreSQL
and through the ORM elsewhere; ``backend.build_job`` + ``store.jobs_insert``
(the ORM, used by the scheduler and workflows) is the reference here.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import DataError, transaction
from django.utils import timezone

from django_dispatch import enqueue_many, store
from django_dispatch.backend import DispatchBackend
from django_dispatch.compat import (
    TASKS_LOGGER,
    InvalidTask,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from django_dispatch.exceptions import InvalidTaskArguments
from django_dispatch.models import Job
from django_dispatch.tasks import enqueue
from django_dispatch.tasks.registry import PLAN_CACHE_SIZE
from django_dispatch.tasks.results import (
    enqueued_signal_is_silent,
    ready_result,
    ready_results,
    result_from_job,
)
from django_dispatch.tasks.task import check_arguments
from tests.conftest import postgres_only
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

#: JSON that is easy to get wrong: unicode (also outside the BMP), escapes,
#: nesting, integers past 64 bits, floats, None, empty containers.
AWKWARD = [
    "",
    "héllo wörld ✓ 漢字 🎉",
    'quote " backslash \\ slash / tab \t newline \n',
    {"nested": {"list": [1, [2, [3, {"deep": None}]]], "empty": {}, "e": []}},
    2**70,
    -(2**63) - 1,
    1.5,
    -0.25,
    1.0,
    True,
    False,
    None,
    [],
    {},
    {"b": 1, "a": 2, "ü": "ß"},
]


def _value(i: int) -> Any:
    return {"i": i, "v": AWKWARD[i % len(AWKWARD)], "t": (i, "tuple")}


def _expected(i: int) -> Any:
    """``_value(i)`` after the JSON round trip (tuples become lists)."""
    return {"i": i, "v": AWKWARD[i % len(AWKWARD)], "t": [i, "tuple"]}


def _row(job_id: int | str) -> dict[str, Any]:
    return Job.objects.values().get(pk=job_id)


def _stored(job_id: int | str) -> dict[str, Any]:
    """A job's columns, less those that differ between two fresh jobs."""
    row = _row(job_id)
    for name in ("id", "enqueued_at", "run_after"):
        del row[name]
    return row


def _orm_job(task, args, kwargs) -> Job:
    """The reference: a job built by the backend and saved by the ORM."""
    job = task.get_backend().build_job(task, args, kwargs)
    store.jobs_insert([job], db=store.db_alias())
    return job


@pytest.fixture
def small_chunks(monkeypatch):
    """Several INSERT statements (and JSON documents) per enqueue_many."""
    monkeypatch.setattr(enqueue, "ENQUEUE_CHUNK", 700)


# --- round trips -----------------------------------------------------------------


def test_enqueue_many_round_trips_thousands_of_awkward_calls(small_chunks):
    count = 2500
    results = enqueue_many(
        tasks.noop, [((), {"value": _value(i)}) for i in range(count)], return_results=True
    )
    assert len(results) == count == Job.objects.count()
    ids = [int(r.id) for r in results]
    assert ids == sorted(ids) and len(set(ids)) == count
    for i, result in enumerate(results):
        assert result.args == [] and result.kwargs == {"value": _expected(i)}
        assert result.status == TaskResultStatus.READY and result.backend == "default"
    stored = dict(Job.objects.values_list("id", "kwargs"))
    assert [stored[int(r.id)] for r in results] == [{"value": _expected(i)} for i in range(count)]
    # get_result() rebuilds an equal TaskResult, enqueued_at included
    for result in results[:: count // 50] + results[-3:]:
        assert tasks.noop.get_result(result.id) == result


def test_enqueue_many_positional_args_round_trip():
    calls = [((_value(i), i), {}) for i in range(300)]
    results = enqueue_many(tasks.add, calls, return_results=True)
    assert [r.args for r in results] == [[_expected(i), i] for i in range(300)]
    assert [tasks.add.get_result(r.id) for r in results] == results


def test_enqueue_many_splits_chunks_whose_json_is_too_long(monkeypatch):
    monkeypatch.setattr(enqueue, "ENQUEUE_CHUNK_CHARS", 1000)
    results = enqueue_many(
        tasks.echo, [(("x" * 100 + str(i),), {}) for i in range(57)], return_results=True
    )
    assert [r.args for r in results] == [["x" * 100 + str(i)] for i in range(57)]
    assert [tasks.echo.get_result(r.id) for r in results] == results


def test_single_enqueue_round_trips_awkward_values():
    for i in range(len(AWKWARD)):
        result = tasks.noop.enqueue(value=_value(i))
        assert result.kwargs == {"value": _expected(i)}
        assert tasks.noop.get_result(result.id) == result


def test_enqueue_many_of_nothing_writes_nothing():
    assert enqueue_many(tasks.add, []) == []
    assert enqueue_many(tasks.add, iter([])) == []
    assert not Job.objects.exists()


def test_enqueue_many_accepts_any_iterables():
    def gen():
        yield (x for x in (1, 2)), {}
        yield [3], {"b": 4}
        yield (), iter([("a", 5), ("b", 6)])

    results = enqueue_many(tasks.add, gen(), return_results=True)
    assert [(r.args, r.kwargs) for r in results] == [
        ([1, 2], {}),
        ([3], {"b": 4}),
        ([], {"a": 5, "b": 6}),
    ]


# --- stored exactly as the ORM path stores -----------------------------------------


def _configured_tasks():
    later = timezone.now() + timedelta(hours=2)
    return [
        tasks.add,
        tasks.echo,  # priority 5, queue "emails"
        tasks.fail_twice,  # max_attempts 3
        tasks.add.using(priority=-7, queue_name="other"),
        tasks.add.using(run_after=later),
        tasks.add.using(partition_key="customer:42"),
        tasks.add.using(priority=100, partition_key="k", run_after=later, queue_name="q"),
    ]


@pytest.mark.parametrize("index", range(7))
def test_columns_are_stored_as_by_the_orm(index):
    task = _configured_tasks()[index]
    args: list[Any] = [1] if task in (tasks.echo, tasks.fail_twice) else [1, 2]
    reference = _orm_job(task, args, {})
    single = task.enqueue(*args)
    (bulk,) = enqueue_many(task, [(args, {})], return_results=True)
    expected = _stored(reference.pk)
    assert _stored(single.id) == expected
    assert _stored(bulk.id) == expected
    reference_row = _row(reference.pk)
    for result in (single, bulk):
        row = _row(result.id)
        assert row["enqueued_at"] == result.enqueued_at
        if task.run_after is None:
            assert row["run_after"] == row["enqueued_at"]
        else:
            assert row["run_after"] == task.run_after == reference_row["run_after"]
        assert task.get_result(result.id) == result
        assert result == result_from_job(Job.objects.get(pk=result.id), task=task)


def test_bulk_rows_of_one_statement_share_their_enqueue_time():
    results = enqueue_many(tasks.add, [((i, i), {}) for i in range(20)], return_results=True)
    assert len({r.enqueued_at for r in results}) == 1
    assert {row["enqueued_at"] for row in Job.objects.values("enqueued_at")} == {
        results[0].enqueued_at
    }


# --- validation: everything before anything is written ------------------------------


def test_a_bad_call_in_a_later_chunk_writes_nothing(small_chunks):
    calls: list[Any] = [((i, i), {}) for i in range(2000)]
    calls[1500] = ((1, object()), {})
    with pytest.raises(InvalidTaskArguments, match=r"call #1500: Task arguments must be JSON"):
        enqueue_many(tasks.add, calls)
    calls[1500] = ((1,), {})
    with pytest.raises(InvalidTaskArguments, match=r"call #1500: .*cannot be called"):
        enqueue_many(tasks.add, calls)
    calls[1500] = ((1, 2), {"c": 3})
    with pytest.raises(InvalidTaskArguments, match=r"call #1500: .*unexpected keyword"):
        enqueue_many(tasks.add, calls)
    calls[1500] = ((), {"a": float("nan"), "b": 1})
    with pytest.raises(InvalidTaskArguments, match=r"call #1500: Task keyword arguments"):
        enqueue_many(tasks.add, calls)
    calls[1500] = (1, 2, 3)
    with pytest.raises(InvalidTask, match=r"call #1500 must be a pair"):
        enqueue_many(tasks.add, calls)
    assert not Job.objects.exists()


def test_the_first_bad_call_is_named_whatever_its_kind():
    good = ((1, 2), {})
    unbindable = ((1,), {})
    not_json = ((1, object()), {})
    not_a_pair = (1, 2, 3)
    not_a_mapping = ((1, 2), 5)
    cases = [
        ([good, unbindable, not_json], "call #1: "),
        ([good, not_json, unbindable], "call #1: "),
        ([unbindable, good, not_a_pair], "call #0: "),
        ([good, not_json, not_a_pair], "call #1: "),
        ([good, good, not_a_pair, unbindable], "call #2 must be a pair"),
    ]
    for calls, message in cases:
        with pytest.raises(InvalidTask) as caught:
            enqueue_many(tasks.add, calls)
        assert str(caught.value).startswith(message), (calls, str(caught.value))
    with pytest.raises(InvalidTaskArguments, match="call #1: "):
        enqueue_many(tasks.add, [good, ((object(),), {}), not_a_mapping])
    with pytest.raises(InvalidTaskArguments, match="call #1: Task arguments"):
        enqueue_many(tasks.add, [good, ((object(),), 5)])  # args are checked before kwargs
    with pytest.raises(TypeError):  # as Task.enqueue(*args, **5) would: not an InvalidTask
        enqueue_many(tasks.add, [good, not_a_mapping])
    assert not Job.objects.exists()


def test_an_invalid_task_is_reported_as_call_zero():
    bad = tasks.add.using(priority=1)
    object.__setattr__(bad, "priority", 1000)  # became invalid after its definition
    with pytest.raises(InvalidTask, match=r"call #0: priority must be"):
        enqueue_many(bad, [((1, 2), {}), ((3, 4), {})])
    with pytest.raises(InvalidTask, match=r"^priority must be"):
        bad.enqueue(1, 2)
    assert not Job.objects.exists()


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_database_error_in_a_later_chunk_writes_nothing(small_chunks):
    """The third chunk's INSERT fails in the database: nothing of the batch stays."""
    from django.db import connection

    inserts = 0

    def third_insert_fails(execute, sql, params, many, context):
        nonlocal inserts
        if sql.lstrip().startswith("WITH inserted AS (INSERT"):
            inserts += 1
            if inserts == 3:
                raise DataError("the database refused the third chunk")
        return execute(sql, params, many, context)

    calls: list[Any] = [((i, i), {}) for i in range(2000)]
    with connection.execute_wrapper(third_insert_fails), pytest.raises(DataError):
        enqueue_many(tasks.add, calls)  # no transaction around it: autocommit
    assert inserts == 3
    assert not Job.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("bad", ["nul \x00 byte", "lone \ud800 surrogate"])
def test_text_a_json_column_cannot_store_is_refused_before_writing(bad):
    """PostgreSQL's jsonb refuses NUL and unpaired surrogates: a clear error, on every database."""
    calls: list[Any] = [((i, i), {}) for i in range(50)]
    calls[30] = ((bad, 1), {})
    with pytest.raises(InvalidTaskArguments, match=r"call #30: .*cannot store"):
        enqueue_many(tasks.add, calls)
    with pytest.raises(InvalidTaskArguments, match="cannot store"):
        tasks.add.enqueue(bad, 1)
    assert not Job.objects.exists()
    # An escaped backslash followed by "u0000" is ordinary text.
    assert tasks.echo.enqueue(r"C:\u0000dir").args == [r"C:\u0000dir"]


def test_plan_check_agrees_with_check_arguments():
    backend = tasks.add.get_backend()
    shapes: list[tuple[list[Any], dict[str, Any]]] = [
        ([], {}),
        ([1], {}),
        ([1, 2], {}),
        ([1, 2, 3], {}),
        ([1], {"b": 2}),
        ([], {"a": 1, "b": 2}),
        ([], {"value": 1}),
        ([1], {"value": 1}),
        ([], {"key": "k"}),
        (["k"], {}),
        (["k", 1], {}),
    ]
    for task in (tasks.add, tasks.noop, tasks.echo, tasks.with_context, tasks.count_to):
        plan = backend.enqueue_plan(task)
        for args, kwargs in shapes:
            try:
                check_arguments(task, args, kwargs)
                expected = None
            except InvalidTaskArguments as e:
                expected = str(e)
            try:
                plan.check(args, kwargs)
                got = None
            except InvalidTaskArguments as e:
                got = str(e)
            assert got == expected, (task, args, kwargs)


def test_the_plan_cache_stays_bounded():
    backend = tasks.add.get_backend()
    assert isinstance(backend, DispatchBackend)
    for i in range(PLAN_CACHE_SIZE + 50):
        backend.enqueue_plan(tasks.add.using(partition_key=f"user:{i}"))
    assert 0 < len(backend._plans) <= PLAN_CACHE_SIZE


# --- transactions -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_rollback_of_the_callers_transaction_removes_the_jobs(small_chunks):
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        enqueue_many(tasks.add, [((i, i), {}) for i in range(1500)])
        tasks.add.enqueue(1, 2)
        assert Job.objects.count() == 1501
        raise Rollback
    assert not Job.objects.exists()
    with transaction.atomic():
        enqueue_many(tasks.add, [((i, i), {}) for i in range(1500)])
        tasks.add.enqueue(1, 2)
    assert Job.objects.count() == 1501


# --- results and signals ----------------------------------------------------------------


def test_ready_results_equal_constructed_ones():
    now = timezone.now()
    calls = [[[i, {"x": [i]}], {"k": "ü"}] for i in range(3)]
    fast = ready_results(tasks.add, [7, 8, 9], [now] * 3, calls, "default")
    slow = [
        ready_result(tasks.add, job_id, now, args, kwargs, "default")
        for job_id, (args, kwargs) in zip([7, 8, 9], calls, strict=True)
    ]
    assert fast == slow
    assert all(type(r) is type(s) for r, s in zip(fast, slow, strict=True))
    assert fast[0].errors is not fast[1].errors  # no list shared between results


def test_enqueue_many_sends_task_enqueued_per_job_to_receivers():
    received = []

    def receiver(sender, task_result, **kwargs):
        received.append(task_result)

    task_enqueued.connect(receiver)
    try:
        backend = task_backends["default"]
        assert not enqueued_signal_is_silent(backend)
        results = enqueue_many(tasks.add, [((i, i), {}) for i in range(25)], return_results=True)
    finally:
        task_enqueued.disconnect(receiver)
    assert received == results
    assert enqueued_signal_is_silent(backend)


def test_enqueue_many_logs_each_job_when_django_tasks_logs_debug(caplog):
    backend = task_backends["default"]
    assert enqueued_signal_is_silent(backend)
    with caplog.at_level(logging.DEBUG, logger=TASKS_LOGGER):
        assert not enqueued_signal_is_silent(backend)
        results = enqueue_many(tasks.add, [((i, i), {}) for i in range(4)], return_results=True)
    logged = [r.getMessage() for r in caplog.records if r.name == TASKS_LOGGER]
    assert logged == [
        f"Task id={r.id} path=tests.testapp.tasks.add enqueued backend=default" for r in results
    ]
