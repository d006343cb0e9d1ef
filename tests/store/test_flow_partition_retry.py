"""partition_retry (issue #17, item 5): a keyed job waiting for its retry holds
its partition ("hold", the default) or lets the next job pass ("yield")."""

from __future__ import annotations

import pytest

from django_dispatch import store
from django_dispatch.compat import InvalidTask
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from tests.testapp import flow_tasks, tasks

pytestmark = pytest.mark.django_db(transaction=True)


def claim():
    return store.jobs_claim(worker_id="w", queues=(), limit=10, lease_seconds=30)


def fail_for_retry(claimed, seconds=60):
    error = store.error_entry("builtins.ValueError", "boom", "traceback")
    assert store.job_fail_if_leased(claimed.lease, [error], seconds)


def start(task):
    """A keyed job of ``task`` that fails once (retry in a minute), a keyed job behind it."""
    first = task.using(partition_key="K").enqueue("a")
    second = tasks.add.using(partition_key="K").enqueue(1, 1)
    [claimed] = claim()
    assert claimed.id == int(first.id)
    fail_for_retry(claimed)
    return int(first.id), int(second.id)


def test_hold_keeps_the_partition_while_the_head_waits_for_its_retry():
    first, second = start(flow_tasks.flaky_holding)
    assert claim() == []
    assert Job.objects.get(pk=second).state == JobState.BLOCKED
    assert Job.objects.get(pk=first).partition_yield is False


def test_yield_lets_the_next_job_pass_then_the_retry_runs():
    first, second = start(flow_tasks.flaky_yielding)
    assert Job.objects.get(pk=first).partition_yield is True
    [passed] = claim()  # the retry waits; the next job runs meanwhile
    assert passed.id == second
    Job.objects.filter(pk=first).update(run_after=Job.objects.get(pk=first).enqueued_at)
    assert claim() == []  # due again, it is the head, but a job of the key runs
    assert store.job_finish_if_leased(passed.lease, 2)
    [retry] = claim()
    assert retry.id == first and retry.row["attempts"] == 2


def test_a_yielding_job_keeps_its_order_until_it_fails():
    first = flow_tasks.flaky_yielding.using(partition_key="K").enqueue("a")
    tasks.add.using(partition_key="K").enqueue(1, 1)
    assert [c.id for c in claim()] == [int(first.id)]  # yield changes nothing before a retry
    assert claim() == []


def test_a_bad_partition_retry_is_refused():
    from django_dispatch import task

    with pytest.raises(InvalidTask, match="'hold' or 'yield'"):
        task(partition_retry="skip")(tasks.add.func)
