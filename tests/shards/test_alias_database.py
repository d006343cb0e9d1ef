"""An alias with ``OPTIONS["DATABASE"]``: its rows, read and written on that database.

In-process: the enqueue, the result, the list functions, the services that
act on a row by id, the workflow services and the admin's selector, each
against two real PostgreSQL databases. Ids are per database, so the tests
make the same id exist on both and check that each call reaches its own.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from django_dispatch import (
    cancel,
    dead_letters,
    enqueue_many,
    jobs,
    replay,
    retry_now,
    run_now,
    schedules,
    store,
    usage,
)
from django_dispatch.compat import TaskResultDoesNotExist
from django_dispatch.core.states import JobState
from django_dispatch.models import DeadLetter, Job, PausedQueue, WorkflowRun
from django_dispatch.testing import drain
from django_dispatch.workflows import cancel_run, count_runs, list_runs, oldest_runnable_age
from django_dispatch.workflows.testing import drain_workflows
from tests.testapp import tasks
from tests.testapp.models import Execution

from .conftest import EU_DB, two_databases

pytestmark = [
    two_databases,
    pytest.mark.django_db(transaction=True, reset_sequences=True, databases=["default", EU_DB]),
    pytest.mark.usefixtures("eu_alias"),
]

LATER = timedelta(hours=1)


def _on(db: str) -> list[int]:
    return sorted(Job.objects.using(db).values_list("id", flat=True))


def test_an_enqueue_writes_to_its_alias_database_and_get_result_reads_it_there():
    mine = tasks.add.using(backend="eu").enqueue(2, 3)
    theirs = tasks.add.enqueue(1, 1)
    assert mine.id == theirs.id  # one id on each database: the alias decides which
    assert _on(EU_DB) == [int(mine.id)] and _on("default") == [int(theirs.id)]
    assert Job.objects.using(EU_DB).get().namespace == "eu"
    assert tasks.add.using(backend="eu").get_result(mine.id).args == [2, 3]
    assert tasks.add.get_result(theirs.id).args == [1, 1]
    ids = enqueue_many(tasks.add.using(backend="eu"), [((i, i), {}) for i in range(3)])
    assert _on(EU_DB) == sorted([int(mine.id), *map(int, ids)])
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.using(backend="eu").get_result(ids[-1] + "0")


def test_an_enqueue_inside_an_atomic_block_of_the_default_database_is_not_held_by_it():
    """The cross-database rule: the alias's job commits with its own database."""
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 1)  # default: rolled back with the block
        kept = tasks.add.using(backend="eu").enqueue(2, 2)  # jobs_eu: autocommitted
        raise RuntimeError("roll back")
    assert _on("default") == [] and _on(EU_DB) == [int(kept.id)]
    with pytest.raises(RuntimeError), transaction.atomic(using=EU_DB):
        tasks.add.using(backend="eu").enqueue(3, 3)
        raise RuntimeError("roll back")
    assert _on(EU_DB) == [int(kept.id)]


def test_the_list_functions_read_their_alias_database():
    for i in range(3):
        tasks.add.using(backend="eu").enqueue(i, i)
    tasks.add.enqueue(9, 9)
    assert [j.args for j in jobs.list(backend="eu")] == [[2, 2], [1, 1], [0, 0]]
    assert jobs.count(backend="eu") == 3 and jobs.count() == 1
    assert [j.args for j in jobs.list()] == [[9, 9]]
    assert drain(backend="eu") == 3 and drain() == 1
    assert jobs.count(state="succeeded", backend="eu") == 3
    assert len(usage.records(backend="eu")) == 3 and len(usage.records()) == 1
    assert usage.summary(tasks.add, backend="eu")["count"] == 3
    assert set(Execution.objects.values_list("key", flat=True)) == set()  # add records nothing


def test_cancel_retry_now_and_run_now_act_on_the_alias_database_only():
    later = timezone.now() + LATER
    mine = tasks.record.using(backend="eu", run_after=later).enqueue("eu")
    theirs = tasks.record.using(run_after=later).enqueue("default")
    assert mine.id == theirs.id
    assert cancel(mine.id, backend="eu") is True
    assert Job.objects.using(EU_DB).get().state == JobState.CANCELLED
    assert Job.objects.using("default").get().state != JobState.CANCELLED  # same id, untouched
    other = tasks.record.using(backend="eu", run_after=later).enqueue("run-now")
    assert run_now(other.id, backend="eu") is True
    assert Job.objects.using(EU_DB).get(pk=other.id).state == JobState.SUCCEEDED
    assert list(Execution.objects.values_list("key", flat=True)) == ["run-now"]
    assert retry_now(theirs.id, backend="eu") is False  # cancelled there: nothing to retry
    with store.using_backend("eu"):  # the current alias, for the calls that name none
        assert cancel(other.id) is False  # finished on jobs_eu
    assert cancel(theirs.id) is True  # the default alias's job


def test_a_dead_letter_is_replayed_on_its_alias_database():
    failed = tasks.fail_always.using(backend="eu").enqueue("no")
    tasks.fail_always.enqueue("no")
    assert drain(backend="eu") == 1 and drain() == 1
    letter = dead_letters.for_job(failed.id, backend="eu")
    assert letter is not None and letter.namespace == "eu"
    assert DeadLetter.objects.using(EU_DB).count() == 1
    assert [d.pk for d in dead_letters.list(backend="eu")] == [letter.pk]
    again = replay(letter.pk, backend="eu")
    assert int(again.id) in _on(EU_DB) and len(_on("default")) == 1
    assert Job.objects.using(EU_DB).get(pk=again.id).namespace == "eu"
    assert dead_letters.count(replayed=True, backend="eu") == 1
    assert dead_letters.count(replayed=True) == 0


def test_a_dead_letter_of_another_alias_task_is_replayed_on_the_letter_database():
    """A cron entry of ``eu`` runs a ``default`` task: its job, its dead letter and
    the replay all live on ``eu``'s database."""
    from django_dispatch.compat import task_backends

    job = task_backends["default"].build_job(tasks.fail_always, ["cron"], {})
    job.namespace = "eu"  # as the scheduler inserts a slot's job
    store.jobs_insert([job], db=EU_DB)
    assert drain(backend="eu") == 1
    letter = DeadLetter.objects.using(EU_DB).get()
    assert letter.backend == "default" and letter.namespace == "eu"
    again = replay(letter.pk, backend="eu")
    replayed = Job.objects.using(EU_DB).get(pk=again.id)
    assert replayed.namespace == "eu" and replayed.args == ["cron"]
    assert not Job.objects.using("default").exists()


def test_workflows_and_cron_entries_live_on_their_alias_database():
    from tests.testapp.workflows import fan

    run = fan.start({"key": "eu"}, backend="eu")
    assert WorkflowRun.objects.using(EU_DB).get().pk == run.pk
    assert not WorkflowRun.objects.using("default").exists()
    assert [r.pk for r in list_runs(backend="eu")] == [run.pk] and count_runs() == 0
    assert oldest_runnable_age(backend="eu") > 0.0 and oldest_runnable_age() == 0.0
    assert drain_workflows(backend="eu", concurrency=2) == 4
    assert WorkflowRun.objects.using(EU_DB).get().state == "succeeded"
    stuck = fan.start({"key": "cancel-me"}, backend="eu")
    assert cancel_run(stuck.pk, backend="eu") is True
    assert WorkflowRun.objects.using(EU_DB).get(pk=stuck.pk).state == "cancelled"
    schedules.save("nightly", schedule="0 3 * * *", task=tasks.noop, backend="eu")
    assert [e.name for e in schedules.list(backend="eu")] == ["nightly"]
    assert schedules.list() == [] and schedules.get("nightly") is None
    assert schedules.set_enabled("nightly", False, backend="eu") is True
    assert schedules.delete("nightly", backend="eu") is True
    assert not Job.objects.using("default").exists()


def test_pausing_a_queue_of_the_alias_writes_its_database():
    from django_dispatch import pause_queue, paused_queues, resume_queue

    assert pause_queue("emails", backend="eu") is True
    assert PausedQueue.objects.using(EU_DB).count() == 1
    assert not PausedQueue.objects.using("default").exists()
    assert paused_queues(backend="eu") == {"emails"} and paused_queues() == set()
    assert resume_queue("emails", backend="eu") is True


def test_the_admin_selects_an_alias_and_acts_on_its_database(admin_client):
    mine = tasks.record.using(backend="eu", run_after=timezone.now() + LATER).enqueue("eu")
    tasks.record.using(run_after=timezone.now() + LATER).enqueue("default")
    url = reverse("admin:django_dispatch_job_changelist")
    page = admin_client.get(url)
    assert [j.args for j in page.context["cl"].result_list] == [["default"]]
    assert "?alias=eu" in page.content.decode()  # the selector among the filters
    page = admin_client.get(url, {"alias": "eu"})
    assert page.status_code == 200
    assert [j.args for j in page.context["cl"].result_list] == [["eu"]]
    change = reverse("admin:django_dispatch_job_change", args=[mine.id])
    page = admin_client.get(change, {"_changelist_filters": "alias=eu"})
    assert page.status_code == 200 and page.context["original"].args == ["eu"]
    # An action on the selected alias's rows cancels the job there, not its namesake.
    response = admin_client.post(
        url + "?alias=eu",
        {"action": "cancel_jobs", "_selected_action": [mine.id]},
    )
    assert response.status_code == 302
    assert Job.objects.using(EU_DB).get().state == JobState.CANCELLED
    assert Job.objects.using("default").get().state != JobState.CANCELLED
    overview = reverse("admin:django_dispatch_job_overview")
    assert "?namespace=eu" in admin_client.get(overview).content.decode()  # eu in the switch
    tasks.record.using(backend="eu").enqueue("now")  # pending, on jobs_eu only
    page = admin_client.get(overview, {"namespace": "eu"})
    assert page.status_code == 200 and page.context["totals"].pending == 1


def test_cron_and_step_jobs_on_an_alias_database_record_that_alias():
    """A cron entry of ``eu`` and a workflow run on ``eu`` run tasks whose own
    backend is ``default``; their jobs live on ``jobs_eu`` and must record
    ``eu``, or ``get_result`` and ``TaskResult.refresh`` look on the default
    database and miss them."""
    from django_dispatch.compat import task_backends
    from django_dispatch.models import CronEntry
    from django_dispatch.runtime import scheduler
    from tests.testapp.workflows import fan

    schedules.save("tick", schedule="* * * * *", task=tasks.noop, backend="eu")
    CronEntry.objects.using(EU_DB).update(next_run_at=timezone.now() - timedelta(seconds=1))
    with store.using_backend("eu"):
        assert scheduler.tick(namespace="eu") == 1
    fired = Job.objects.using(EU_DB).get()
    assert (fired.backend, fired.namespace) == ("eu", "eu")
    result = task_backends["eu"].get_result(str(fired.pk))
    assert result.backend == "eu"
    assert drain(backend="eu") == 1
    result.refresh()
    assert result.status.name == "SUCCESSFUL"
    fan.start({"key": "eu"}, backend="eu")
    steps = Job.objects.using(EU_DB).exclude(pk=fired.pk)
    assert steps.exists() and set(steps.values_list("backend", "namespace")) == {("eu", "eu")}


def test_admin_links_to_other_rows_keep_the_selected_alias(admin_client):
    """Ids repeat across databases: a link from a page of ``eu`` to a row by id
    must open ``eu``'s row, or the operator acts on the default's namesake."""
    from django_dispatch.models import CronEntry
    from tests.testapp.workflows import fan

    run = fan.start({"key": "eu"}, backend="eu")
    fan.start({"key": "default"})  # the same run and job ids on the default database
    step_job = Job.objects.using(EU_DB).order_by("pk").first()
    assert step_job is not None
    page = admin_client.get(
        reverse("admin:django_dispatch_workflowrun_change", args=[run.pk]), {"alias": "eu"}
    )
    assert page.status_code == 200 and page.context["original"].namespace == "eu"
    job_url = reverse("admin:django_dispatch_job_change", args=[step_job.pk])
    assert f'href="{job_url}?alias=eu"' in page.content.decode()
    schedules.save("nightly", schedule="0 3 * * *", task=tasks.noop, backend="eu")
    entry = schedules.get("nightly", backend="eu")
    assert entry is not None
    # The console lists entries with a next fire time (the scheduler's first tick sets it).
    CronEntry.objects.using(EU_DB).update(next_run_at=timezone.now() + LATER)
    overview = admin_client.get(reverse("admin:django_dispatch_job_overview"), {"namespace": "eu"})
    body = overview.content.decode()
    entry_url = reverse("admin:django_dispatch_cronentry_change", args=[entry.pk])
    assert f'href="{entry_url}?alias=eu"' in body
    letters = reverse("admin:django_dispatch_deadletter_changelist")
    assert f'href="{letters}?replayed=no&amp;alias=eu"' in body
    # Without a choice, the page is the default database's, and so are its links.
    page = admin_client.get(reverse("admin:django_dispatch_workflowrun_change", args=[run.pk]))
    assert page.context["original"].namespace == ""
    assert f'href="{job_url}"' in page.content.decode()
