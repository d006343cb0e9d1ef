"""The jobs list as a console: badges that say what a state means, timing columns,
workflow steps named, arguments search, only the actions that can act, a bounded
"retry all matching" with a confirmation, and every action in the admin history.

Each control is also tried by a view-only user, an anonymous one and a request
without its CSRF token, and must change nothing for them.
"""

from __future__ import annotations

import html
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_dispatch.compat import ADMIN_ACTIONS_ON_CHANGE_PAGE
from django_dispatch.models import DeadLetter, Job, WorkflowTask
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from django_dispatch.workflows.testing import drain_workflows
from tests.conftest import ON_POSTGRES
from tests.testapp import tasks
from tests.testapp import workflows as wfs

CHANGELIST = "admin:django_dispatch_job_changelist"
BULK = "admin:django_dispatch_job_bulk"
DL_BULK = "admin:django_dispatch_deadletter_bulk"


def page(response) -> str:
    return html.unescape(response.content.decode())


def row_of(text: str, job_id: int | str) -> str:
    """The changelist row of job ``job_id`` (its HTML)."""
    marker = f'value="{job_id}"'
    start = text.index(marker)
    return text[text.rindex("<tr", 0, start) : text.index("</tr>", start)]


@pytest.fixture
def user(login):
    """The console tests' name for the suite's ``login`` fixture."""
    return login


@pytest.mark.django_db(transaction=True)
def test_a_job_set_aside_by_a_limit_says_so_not_partition_none(client, user):
    """Review finding (wave 5): every blocked badge named a partition, "partition
    None" for jobs set aside by a concurrency, rate or queue limit."""
    from tests.admin.test_admin_console import limited_queue, set_aside_by_limits

    user(superuser=True)
    with limited_queue():
        blocked = set_aside_by_limits()
        text = page(client.get(reverse(CHANGELIST)))
    keyed, queued = row_of(text, blocked["keyed"][0]), row_of(text, blocked["queued"][0])
    for row in (keyed, queued):
        assert ">blocked<" in row and "partition" not in row
    assert "Over its task's concurrency or rate limit (key 'customer:42')" in keyed
    assert "Over the concurrency or rate limit of queue 'capq'" in queued


@pytest.mark.django_db(transaction=True)
def test_badges_tell_deferred_waiting_blocked_and_failed_apart(client, user):
    user(superuser=True)
    waiting = tasks.add.enqueue(1, 1)
    deferred = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(2, 2)
    head = tasks.echo.using(partition_key="user:7").enqueue("first")
    behind = tasks.echo.using(partition_key="user:7").enqueue("second")
    text = page(client.get(reverse(CHANGELIST)))
    assert "waiting for a worker" in row_of(text, waiting.id)
    assert "dispatch-badge-deferred" in row_of(text, deferred.id)
    assert ">deferred<" in row_of(text, deferred.id)
    assert "waiting for a worker" in row_of(text, head.id)
    assert f">blocked behind #{head.id}<" in row_of(text, behind.id)
    assert "user:7" in row_of(text, behind.id)
    assert "in partition 'user:7' to finish" in row_of(text, behind.id)
    failed = tasks.fail_always.enqueue("customer 17 has no address")
    drain(queues=["default"])
    text = page(client.get(reverse(CHANGELIST)))
    row = row_of(text, failed.id)
    assert "dispatch-badge-failed" in row
    assert "ValueError: customer 17 has no address" in row  # the last error column
    # Times are relative, the exact time on hover; wait and run are columns.
    assert 'class="dispatch-age"' in row and "just now" in row and 'title="20' in row
    assert "Waited" in text and "Ran" in text and "Tries" in text
    deferred_row = row_of(text, deferred.id)
    assert "runs <time" in deferred_row  # its run_after, relative, exact on hover
    assert "in 59 min" in deferred_row or "in 1 h" in deferred_row
    # The list refreshes itself (our own script, served with the app).
    assert 'id="dispatch-results" data-dispatch-live' in text
    assert "django_dispatch/console.js" in text


@pytest.mark.django_db(transaction=True)
def test_a_workflow_step_job_names_its_run_and_step_and_a_failed_step_reads_failed(client, user):
    user(superuser=True)
    run = wfs.gated.start({"key": "console"})
    drain_workflows()
    gate = WorkflowTask.objects.get(run=run, name="gate")
    assert gate.state == "failed"
    jobs = Job.objects.filter(task_path="django_dispatch.workflows.tasks.run_step")
    gate_jobs = [j for j in jobs if j.args and j.args[0] == gate.pk]
    assert gate_jobs and all(j.state == JobState.SUCCEEDED for j in gate_jobs)
    text = page(client.get(reverse(CHANGELIST)))
    row = row_of(text, gate_jobs[-1].pk)
    assert "step failed" in row and "dispatch-badge-failed" in row
    assert f"tests.gated #{run.pk}</a>" in row and ">gate</a>" in row
    assert reverse("admin:django_dispatch_workflowrun_change", args=[run.pk]) in row
    prepare = WorkflowTask.objects.get(run=run, name="prepare")
    ok_row = row_of(text, prepare.job_id)
    assert "step failed" not in ok_row and "Succeeded" in ok_row


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not ON_POSTGRES, reason="map batches: PostgreSQL only")
def test_a_map_batchs_job_names_its_children_count_mapping_step_and_run(client, user):
    from django_dispatch.store.workflows import mapbatch
    from tests.runtime.test_workflow_maps import fan, spread

    user(superuser=True)
    run = fan("admin-batch", 3 * mapbatch.MIN_JOBS + 1)
    drain(max_jobs=1)  # the mapping step: the set is inserted, its batches queued
    batch = Job.objects.filter(task_path="django_dispatch.workflows.tasks.run_steps").first()
    assert batch is not None and len(batch.args[0]) == 3
    mapping = spread(run)
    text = page(client.get(reverse(CHANGELIST), {"q": "run_steps"}))
    row = row_of(text, batch.pk)
    assert "3 children of map" in row and f">{mapping.name}</a>" in row
    assert reverse("admin:django_dispatch_workflowtask_change", args=[mapping.pk]) in row
    assert reverse("admin:django_dispatch_workflowrun_change", args=[run.pk]) in row
    detail = page(client.get(reverse("admin:django_dispatch_job_change", args=[batch.pk])))
    assert "3 children of map" in detail
    plain = tasks.noop.enqueue()
    detail = page(client.get(reverse("admin:django_dispatch_job_change", args=[plain.id])))
    assert "children of map" not in detail


@pytest.mark.django_db(transaction=True)
def test_search_by_arguments(client, user):
    user(superuser=True)
    ada = tasks.record.enqueue("ada")
    bob = tasks.record.enqueue("bob")
    kw = tasks.fail_always.enqueue(message="customer 42")
    text = page(client.get(reverse(CHANGELIST), {"q": '["ada"]'}))
    assert f'value="{ada.id}"' in text and f'value="{bob.id}"' not in text
    text = page(client.get(reverse(CHANGELIST), {"q": '{"message": "customer 42"}'}))
    assert f'value="{kw.id}"' in text and f'value="{ada.id}"' not in text
    # Not JSON: the usual search (task path).
    text = page(client.get(reverse(CHANGELIST), {"q": "fail_always"}))
    assert f'value="{kw.id}"' in text and f'value="{ada.id}"' not in text
    if ON_POSTGRES:  # containment reaches into nested values
        nested = tasks.noop.enqueue({"order": {"id": 9, "lines": 3}})
        text = page(client.get(reverse(CHANGELIST), {"q": '[{"order": {"id": 9}}]'}))
        assert f'value="{nested.id}"' in text


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not ADMIN_ACTIONS_ON_CHANGE_PAGE, reason="actions on the page: Django 6.1")
def test_a_job_page_offers_only_the_actions_that_can_act(client, user):
    user(superuser=True)
    pending = tasks.add.enqueue(1, 1)
    done = tasks.add.enqueue(2, 2)
    drain(queues=["default"])
    pending = tasks.add.enqueue(3, 3)  # enqueued after the drain: still pending

    def offered(job_id) -> set[str]:
        response = client.get(reverse("admin:django_dispatch_job_change", args=[job_id]))
        form = response.context["action_form"]
        return {name for name, _ in form.fields["action"].choices} - {""} if form else set()

    assert offered(pending.id) == {"cancel_jobs"}
    assert offered(done.id) == set()  # nothing to cancel or retry (delete: the list)
    failed = tasks.fail_always.enqueue()
    drain(queues=["default"])
    assert offered(failed.id) == {"retry_jobs"}


@pytest.mark.django_db(transaction=True)
def test_cancel_and_retry_are_recorded_in_the_history(client, user):
    user(superuser=True)
    job = tasks.add.enqueue(1, 1)
    failed = tasks.fail_always.enqueue()
    data = {"action": "cancel_jobs", "_selected_action": [str(job.id)], "index": "0"}
    client.post(reverse(CHANGELIST), data)
    drain(queues=["default"])
    data = {"action": "retry_jobs", "_selected_action": [str(failed.id)], "index": "0"}
    client.post(reverse(CHANGELIST), data)
    entries = {(e.object_id, e.change_message) for e in LogEntry.objects.all()}
    letter = DeadLetter.objects.get(job_id=int(failed.id))
    assert (str(job.id), "Cancelled (admin action).") in entries
    replayed = f"Replayed dead letter #{letter.pk} as job #{letter.replay_job_id} (admin action)."
    assert (str(failed.id), replayed) in entries and (str(letter.pk), replayed) in entries
    # The job's own History page shows it.
    history = page(client.get(reverse("admin:django_dispatch_job_history", args=[job.id])))
    assert "Cancelled (admin action)." in history


@pytest.mark.django_db(transaction=True)
def test_retry_all_matching_confirms_the_count_then_acts_on_those_only(client, user):
    user(superuser=True)
    failed = [tasks.fail_always.enqueue(f"n{i}") for i in range(3)]
    other = tasks.fail_twice.enqueue("x")  # fails once, then waits for its retry
    ok = tasks.add.enqueue(1, 1)
    drain(queues=["default"])
    listing = page(
        client.get(reverse(CHANGELIST), {"task_path": "tests.testapp.tasks.fail_always"})
    )
    assert "Retry / replay all matching" in listing
    query = {"task_path": "tests.testapp.tasks.fail_always"}
    confirm = page(client.get(reverse(BULK), query))
    assert 'id="dispatch-bulk-count">3<' in confirm and "task_path=" in confirm
    assert "No, take me back" in confirm
    # GET changed nothing.
    assert DeadLetter.objects.filter(replayed_at__isnull=False).count() == 0
    response = client.post(reverse(BULK) + "?task_path=tests.testapp.tasks.fail_always")
    assert response.status_code == 302
    replayed = DeadLetter.objects.filter(replayed_at__isnull=False)
    assert sorted(d.job_id for d in replayed) == sorted(int(r.id) for r in failed)
    assert Job.objects.get(pk=ok.id).state == JobState.SUCCEEDED
    assert not DeadLetter.objects.filter(job_id=int(other.id), replayed_at__isnull=False).exists()


@pytest.mark.django_db(transaction=True)
def test_replay_all_matching_dead_letters(client, user):
    user(superuser=True)
    for i in range(2):
        tasks.fail_always.enqueue(f"n{i}")
    drain(queues=["default"])
    confirm = page(client.get(reverse(DL_BULK), {"replayed": "no"}))
    assert 'id="dispatch-bulk-count">2<' in confirm
    client.post(reverse(DL_BULK) + "?replayed=no")
    assert DeadLetter.objects.filter(replayed_at__isnull=True).count() == 0
    assert LogEntry.objects.filter(change_message__startswith="Replayed").count() >= 2


# --- every control refuses view-only users, anonymous users and forged requests ------


def controls(job_id: int, letter_id: int) -> list[tuple[str, str, dict]]:
    """(name, url, POST data) of each control on the jobs and dead letters pages."""
    changelist = reverse(CHANGELIST)
    dl_changelist = reverse("admin:django_dispatch_deadletter_changelist")

    def action(name, pk):
        return {"action": name, "_selected_action": [str(pk)], "index": "0"}

    return [
        ("cancel", changelist, action("cancel_jobs", job_id)),
        ("retry", changelist, action("retry_jobs", letter_id and job_id)),
        ("bulk retry", reverse(BULK), {}),
        ("replay", dl_changelist, action("replay_entries", letter_id)),
        ("bulk replay", reverse(DL_BULK), {}),
        (
            "replay with arguments",
            reverse("admin:django_dispatch_deadletter_replay", args=[letter_id]),
            {"args": "[]", "kwargs": "{}"},
        ),
    ]


def snapshot() -> tuple:
    return (
        sorted(Job.objects.values_list("pk", "state")),
        sorted(DeadLetter.objects.values_list("pk", "replayed_at")),
    )


@pytest.mark.django_db(transaction=True)
def test_every_control_refuses_view_only_anonymous_and_csrf_less_requests(
    client, user, django_user_model
):
    live = tasks.add.enqueue(1, 1)
    failed = tasks.fail_always.enqueue()
    drain(queues=["default"])
    live = tasks.add.enqueue(2, 2)
    letter = DeadLetter.objects.get(job_id=int(failed.id))
    before = snapshot()
    for name, url, data in controls(int(live.id), letter.pk):
        anonymous = Client()
        response = anonymous.post(url, data)
        assert response.status_code == 302 and "/login/" in response["Location"], name
    viewer = user("view_job", "view_deadletter", name="viewer")
    for name, url, data in controls(int(live.id), letter.pk):
        response = client.post(url, data)
        # Django answers a forged action with the list again (200, "no action
        # selected"); our own pages with 403. Either way nothing changes.
        assert response.status_code in (200, 403), name
        assert snapshot() == before, name
    assert "Retry / replay all matching" not in page(client.get(reverse(CHANGELIST)))
    operator = django_user_model.objects.create_superuser("boss", "b@x.test", "pw")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    for name, url, data in controls(int(live.id), letter.pk):
        assert strict.post(url, data).status_code == 403, name
    assert snapshot() == before
    assert viewer.pk != operator.pk
    # The same requests with the token and the permission do act.
    client.force_login(operator)
    client.post(*controls(int(live.id), letter.pk)[0][1:])
    assert Job.objects.get(pk=live.id).state == JobState.CANCELLED


@pytest.mark.django_db(transaction=True)
def test_links_from_workers_and_cron_entries_to_their_jobs(client, user):
    from django_dispatch import store
    from django_dispatch.models import CronEntry

    user(superuser=True)
    store.worker_register("w-7", hostname="box-7", pid=7, queues=[], concurrency=2)
    running = tasks.add.enqueue(1, 1)
    Job.objects.filter(pk=running.id).update(state=JobState.RUNNING, worker_id="w-7")
    other = tasks.add.enqueue(2, 2)
    workers = page(client.get(reverse("admin:django_dispatch_worker_changelist")))
    link = "?worker_id__exact=w-7&state__exact=running"
    assert link in workers
    jobs = page(client.get(reverse(CHANGELIST) + link))
    assert f'value="{running.id}"' in jobs and f'value="{other.id}"' not in jobs
    Job.objects.filter(pk=running.id).update(state=JobState.PENDING, worker_id=None)

    entry = CronEntry.objects.create(
        name="hourly",
        schedule="0 * * * *",
        timezone="UTC",
        task_path="tests.testapp.tasks.add",
        args=[1, 2],
    )
    fired = tasks.add.using(idempotency_key="cron:hourly:2026-01-01T00:00:00+00:00").enqueue(1, 2)
    detail = page(client.get(reverse("admin:django_dispatch_cronentry_change", args=[entry.pk])))
    start = detail.index("jobs fired")
    href = detail[detail.rindex('href="', 0, start) + 6 : detail.rindex('"', 0, start)]
    jobs = page(client.get(href))
    assert f'value="{fired.id}"' in jobs and f'value="{other.id}"' not in jobs
    # Run now: a job, "last run" set, and a line in the entry's history.
    data = {"action": "run_now", "_selected_action": [str(entry.pk)], "index": "0"}
    client.post(reverse("admin:django_dispatch_cronentry_changelist"), data)
    entry.refresh_from_db()
    assert entry.last_run_at is not None
    history = page(client.get(reverse("admin:django_dispatch_cronentry_history", args=[entry.pk])))
    assert "Run now: enqueued job #" in history


@pytest.mark.django_db(transaction=True)
def test_cron_workflow_and_queue_controls_refuse_view_only_anonymous_and_csrf_less(
    client, user, django_user_model
):
    from django_dispatch.models import CronEntry, PausedQueue, WorkflowRun

    entry = CronEntry.objects.create(
        name="hourly",
        schedule="0 * * * *",
        timezone="UTC",
        task_path="tests.testapp.tasks.add",
        args=[1, 2],
    )
    run = wfs.gated.start({"key": "controls"})
    drain_workflows()  # the gate step fails: the run is stuck
    assert WorkflowRun.objects.get(pk=run.pk).state == "stuck"

    def action(name, pk):
        return {"action": name, "_selected_action": [str(pk)], "index": "0"}

    runs = reverse("admin:django_dispatch_workflowrun_changelist")
    controls = [
        (
            "cron run now",
            reverse("admin:django_dispatch_cronentry_changelist"),
            action("run_now", entry.pk),
        ),
        (
            "cron disable",
            reverse("admin:django_dispatch_cronentry_changelist"),
            action("disable_entries", entry.pk),
        ),
        ("run cancel", runs, action("cancel_runs", run.pk)),
        ("run retry (unpark)", runs, action("retry_runs", run.pk)),
        ("run skip", runs, action("skip_current_steps", run.pk)),
        (
            "replay from step",
            reverse("admin:django_dispatch_workflowrun_replay", args=[run.pk]),
            {"step": "gate", "generation": "1"},
        ),
        (
            "queue pause",
            reverse("admin:django_dispatch_pausedqueue_changelist"),
            {"action": "pause", "queue": "default"},
        ),
    ]

    def state() -> tuple:
        return (
            Job.objects.count(),
            sorted(CronEntry.objects.values_list("pk", "enabled", "last_run_at")),
            sorted(WorkflowRun.objects.values_list("pk", "state", "generation")),
            sorted(WorkflowTask.objects.values_list("pk", "state")),
            PausedQueue.objects.count(),
            LogEntry.objects.count(),
        )

    before = state()
    for name, url, data in controls:
        response = Client().post(url, data)
        assert response.status_code == 302 and "/login/" in response["Location"], name
    user(
        "view_cronentry",
        "view_workflowrun",
        "view_workflowtask",
        "view_pausedqueue",
        name="viewer",
    )
    for name, url, data in controls:
        assert client.post(url, data).status_code in (200, 302, 403), name
        assert state() == before, name
    operator = django_user_model.objects.create_superuser("boss", "b@x.test", "pw")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    for name, url, data in controls:
        assert strict.post(url, data).status_code == 403, name
    assert state() == before
    # Allowed and with the token, each acts and leaves a line in the history.
    client.force_login(operator)
    for _name, url, data in (controls[0], controls[-1], controls[4]):
        client.post(url, data)
    messages = set(LogEntry.objects.values_list("change_message", flat=True))
    assert any(m.startswith("Run now: enqueued job #") for m in messages)
    assert "Paused queue 'default' (Queues page)." in messages
    assert "had their step skipped (admin action)." in messages
