"""Call context: set per call or by DISPATCH["CALL_CONTEXT"], stored on the job,
read by the task as ``context.call_context``, carried to retries and replays."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_dispatch import enqueue_many, services, store
from django_dispatch.compat import InvalidTask
from django_dispatch.core.limits import JSONTooLarge
from django_dispatch.exceptions import InvalidTaskArguments
from django_dispatch.models import DeadLetter, Job
from django_dispatch.testing import drain
from tests.testapp import context_tasks, tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

CURRENT = "tests.testapp.context_tasks.current"


@pytest.fixture
def current():
    """The "request's" context the DISPATCH default returns."""
    context_tasks.CURRENT.clear()
    yield context_tasks.CURRENT
    context_tasks.CURRENT.clear()


def _seen(key: str) -> list:
    return [json.loads(s.note) for s in SideEffect.objects.filter(key=key).order_by("id")]


def test_using_call_context_reaches_the_row_and_the_task():
    result = context_tasks.record.using(call_context={"user": 42, "ip": "::1"}).enqueue("a")
    assert Job.objects.get(pk=result.id).call_context == {"user": 42, "ip": "::1"}
    assert drain() == 1
    assert _seen("a") == [{"user": 42, "ip": "::1"}]


def test_without_any_context_the_row_and_the_task_have_none():
    result = context_tasks.record.enqueue("none")
    assert Job.objects.get(pk=result.id).call_context is None
    drain()
    assert _seen("none") == [None]


def test_enqueue_many_stores_the_batchs_context_on_every_row():
    task = context_tasks.record.using(call_context={"batch": "b1"})
    ids = enqueue_many(task, [([f"m{i}"], {}) for i in range(5)])
    assert [Job.objects.get(pk=i).call_context for i in ids] == [{"batch": "b1"}] * 5


def test_the_default_applies_only_when_a_call_gives_none(current):
    current["value"] = {"user": 7}
    with override_settings(DISPATCH={"CALL_CONTEXT": CURRENT}):
        by_default = context_tasks.record.enqueue("d")
        own = context_tasks.record.using(call_context={"user": 8}).enqueue("o")
        ids = enqueue_many(context_tasks.record, [(["m"], {}), (["n"], {})])
        current["value"] = None  # outside any request: none
        outside = context_tasks.record.enqueue("x")
        drain()
    assert Job.objects.get(pk=by_default.id).call_context == {"user": 7}
    assert Job.objects.get(pk=own.id).call_context == {"user": 8}
    assert [Job.objects.get(pk=i).call_context for i in ids] == [{"user": 7}] * 2
    assert Job.objects.get(pk=outside.id).call_context is None
    assert _seen("d") == [{"user": 7}] and _seen("x") == [None]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.testapp.context_tasks.broken", "raised LookupError: no request here"),
        ("tests.testapp.context_tasks.not_a_dict", "must be a dict"),
    ],
)
def test_a_failing_default_refuses_the_enqueue_and_writes_nothing(path, message):
    with override_settings(DISPATCH={"CALL_CONTEXT": path}):
        with pytest.raises(InvalidTask, match="CALL_CONTEXT") as raised:
            context_tasks.record.enqueue("x")
        assert message in str(raised.value)
        with pytest.raises(InvalidTask, match="CALL_CONTEXT"):
            enqueue_many(context_tasks.record, [(["y"], {})])
    assert not Job.objects.exists()


def test_a_default_that_cannot_be_imported_is_reported_by_the_settings_check():
    from django_dispatch.conf import get_settings

    with override_settings(DISPATCH={"CALL_CONTEXT": "tests.nowhere.current"}):
        problems = get_settings().validate()
    assert any("DISPATCH['CALL_CONTEXT']" in p and "cannot be imported" in p for p in problems)


@pytest.mark.parametrize("bad", [["user", 42], "user=42", 42, {"when": object()}])
def test_a_bad_call_context_is_refused_naming_it(bad):
    with pytest.raises(InvalidTaskArguments, match="call_context"):
        context_tasks.record.using(call_context=bad)
    assert not Job.objects.exists()


def test_a_call_context_over_max_args_bytes_is_refused():
    with override_settings(DISPATCH={"MAX_ARGS_BYTES": 100}):
        context_tasks.record.using(call_context={"note": "x" * 80})
        with pytest.raises(JSONTooLarge, match="call_context"):
            context_tasks.record.using(call_context={"note": "x" * 100})
    assert not Job.objects.exists()


def test_tasks_differing_only_by_call_context_share_one_plan():
    backend = context_tasks.record.get_backend()
    first = backend.enqueue_plan(context_tasks.record.using(call_context={"user": 1}))
    second = backend.enqueue_plan(context_tasks.record.using(call_context={"user": 2}))
    assert first is second
    assert first.task.call_context is None  # the shared plan keeps no call's context


def test_a_plain_enqueue_runs_the_statement_it_ran_without_call_contexts():
    with CaptureQueriesContext(connection) as plain:
        tasks.add.enqueue(1, 2)
    with CaptureQueriesContext(connection) as contextual:
        tasks.add.using(call_context={"user": 1}).enqueue(1, 2)
    assert len(plain.captured_queries) == len(contextual.captured_queries) == 1
    if connection.vendor == "postgresql":  # the raw INSERT: the column only when set
        assert "call_context" not in plain.captured_queries[0]["sql"]
        assert "call_context" in contextual.captured_queries[0]["sql"]


@pytest.mark.parametrize("deferred", [False, True])
def test_the_raw_and_orm_inserts_store_the_same_row(deferred):
    task = tasks.add.using(call_context={"user": 42, "nested": {"a": [1, None]}})
    if deferred:  # run_after's parameter comes before the context's
        later = timezone.now() + timedelta(hours=1)
        task = task.using(run_after=later, partition_key="k", priority=3)
    spec = task.get_backend().enqueue_plan(task).spec
    reference = spec.new_job([1, 2], {}, ('{"user":42,"nested":{"a":[1,null]}}', None))
    store.jobs_insert([reference], db=store.db_alias())
    single = task.enqueue(1, 2)
    (bulk,) = enqueue_many(task, [([1, 2], {})])
    rows = [Job.objects.values().get(pk=pk) for pk in (reference.pk, single.id, bulk)]
    for row in rows:
        for name in ("id", "enqueued_at") if deferred else ("id", "enqueued_at", "run_after"):
            del row[name]
        # An enqueue stores its trace context once a test has set a tracer
        # provider (OpenTelemetry allows one per process); the reference row has none.
        del row["trace_context"]
    assert rows[0]["call_context"] == {"user": 42, "nested": {"a": [1, None]}}
    assert rows[1] == rows[0] and rows[2] == rows[0]


def test_a_retry_sees_the_same_context():
    result = context_tasks.record_then_fail_once.using(call_context={"user": 5}).enqueue("r")
    drain()
    assert Job.objects.get(pk=result.id).attempts == 2
    assert _seen("r") == [{"user": 5}, {"user": 5}]


def test_a_replay_carries_the_failed_jobs_context(current):
    failed = context_tasks.always_fails.using(call_context={"user": 9}).enqueue()
    drain()
    letter = DeadLetter.objects.get(job_id=failed.id)
    assert letter.call_context == {"user": 9}
    Job.objects.filter(pk=failed.id).delete()  # retention may delete the job first
    current["value"] = {"user": "admin"}
    with override_settings(DISPATCH={"CALL_CONTEXT": CURRENT}):
        replayed = services.replay(letter.id, replayed_by="admin")
    assert Job.objects.get(pk=replayed.id).call_context == {"user": 9}
