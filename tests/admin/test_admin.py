"""The admin pages, through Django's test client on the real database.

Users with different permissions see (and may run) different actions; every
action is checked by its effect on the rows, and forged POSTs by users
without the permission change nothing.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_dispatch import enqueue_many, services, store
from django_dispatch.admin.common import CappedPaginator
from django_dispatch.checks import check_dispatch_settings
from django_dispatch.compat import ADMIN_ACTIONS_ON_CHANGE_PAGE
from django_dispatch.core.states import FINISHED_STATES, LIVE_STATES
from django_dispatch.models import CronEntry, DeadLetter, Job, Worker
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from tests.conftest import wait_until
from tests.testapp import tasks

FAIL_ALWAYS = "tests.testapp.tasks.fail_always"
ALL_VIEW = ["view_job", "view_deadletter", "view_cronentry", "view_worker"]


# --- helpers --------------------------------------------------------------------------


def url(model: str, view: str, *args: object) -> str:
    return reverse(f"admin:django_dispatch_{model}_{view}", args=args)


def run_action(client, model: str, action: str, ids, **extra):
    data = {"action": action, "_selected_action": [str(i) for i in ids], "index": "0", **extra}
    return client.post(url(model, "changelist"), data, follow=True)


def page(response) -> str:
    return html.unescape(response.content.decode())


def action_names(response) -> set[str]:
    form = response.context["action_form"]
    if form is None:  # no action at all for this user
        return set()
    return {name for name, _ in form.fields["action"].choices} - {""}


def dead_letter_of(result) -> DeadLetter:
    return DeadLetter.objects.get(job_id=int(result.id))


def failed_job(message: str = "boom"):
    """A job of fail_always run to its end: FAILED, with a dead letter."""
    result = tasks.fail_always.enqueue(message)
    drain()
    return result


# --- every page renders, for the right people ---------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("superuser", [True, False])
def test_changelists_and_details_render(client, login, superuser):
    login(*ALL_VIEW, superuser=superuser)
    job = tasks.add.enqueue(1, 2)
    entry = CronEntry.objects.create(
        name="nightly", schedule="0 3 * * *", timezone="Europe/Paris", task_path=FAIL_ALWAYS
    )
    store.worker_register("w-1", hostname="host", pid=123, queues=["emails"], concurrency=4)
    for model in ("job", "deadletter", "cronentry", "worker"):
        assert client.get(url(model, "changelist")).status_code == 200, model
    assert client.get(url("job", "change", job.id)).status_code == 200
    assert client.get(url("cronentry", "change", entry.pk)).status_code == 200
    response = client.get(url("worker", "changelist"))
    assert "w-1" in page(response) and "emails" in page(response)


@pytest.mark.django_db
def test_pages_need_the_view_permission(client, login):
    login()  # staff, no permission at all
    for model in ("job", "deadletter", "cronentry", "worker"):
        assert client.get(url(model, "changelist")).status_code == 403, model


@pytest.mark.django_db
def test_jobs_workers_and_dead_letters_are_read_only(client, login):
    login(superuser=True)
    job = tasks.add.enqueue(1, 2)
    assert client.get(url("job", "add")).status_code == 403
    assert client.get(url("deadletter", "add")).status_code == 403
    assert client.get(url("worker", "add")).status_code == 403
    assert client.get(url("job", "delete", job.id)).status_code == 403
    response = client.get(url("job", "change", job.id))
    assert 'name="_save"' not in page(response)
    # A forged edit changes nothing.
    assert client.post(url("job", "change", job.id), {"state": "succeeded"}).status_code == 403
    assert Job.objects.get(pk=job.id).state == JobState.PENDING
    # Django's delete_selected is replaced by "delete finished" (which skips live jobs).
    actions = action_names(client.get(url("job", "changelist")))
    assert "delete_selected" not in actions and "delete_finished_jobs" in actions


@pytest.mark.django_db(transaction=True)
def test_detail_pages_show_pretty_json_and_tracebacks(client, login):
    login(*ALL_VIEW)
    result = failed_job("kaboom")
    response = client.get(url("job", "change", result.id))
    text = page(response)
    assert response.status_code == 200
    assert '<pre class="dispatch-traceback">Traceback (most recent call last):' in text
    assert "raise ValueError(message)" in text and "ValueError: kaboom" in text
    assert '<pre class="dispatch-json">[\n  "kaboom"\n]</pre>' in text
    letter = dead_letter_of(result)
    assert f"Dead letter #{letter.pk}" in text

    response = client.get(url("deadletter", "change", letter.pk))
    text = page(response)
    assert response.status_code == 200
    assert "Traceback (most recent call last):" in text and "ValueError: kaboom" in text
    assert "Replay history" in text
    # No replay permission: no link to the corrected-arguments page.
    assert "Replay with corrected arguments" not in text


# --- jobs: cancel, retry, delete ------------------------------------------------------------


@pytest.mark.django_db
def test_cancel_is_hidden_and_refused_without_cancel_job(client, login):
    login(*ALL_VIEW)
    job = tasks.add.enqueue(1, 2)
    assert "cancel_jobs" not in action_names(client.get(url("job", "changelist")))
    assert run_action(client, "job", "cancel_jobs", [job.id]).status_code == 200
    # On the change form too.
    client.post(
        url("job", "change", job.id),
        {"CHANGE_FORM-action": "cancel_jobs", "_selected_action": str(job.id)},
    )
    assert Job.objects.get(pk=job.id).state == JobState.PENDING


@pytest.mark.django_db
def test_cancel_with_cancel_job_reports_counts(client, login):
    login(*ALL_VIEW, "cancel_job")
    pending = [tasks.add.enqueue(i, i) for i in range(2)]
    blocked_first = tasks.add.using(partition_key="p").enqueue(0, 0)
    blocked = tasks.add.using(partition_key="p").enqueue(1, 1)
    finished = tasks.add.enqueue(9, 9)
    assert services.cancel(finished.id)
    assert "cancel_jobs" in action_names(client.get(url("job", "changelist")))

    ids = [r.id for r in (*pending, blocked, finished)]
    response = run_action(client, "job", "cancel_jobs", ids)
    assert "3 cancelled, 1 skipped (already finished)." in page(response)
    states = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert set(states.values()) == {JobState.CANCELLED}
    assert Job.objects.get(pk=blocked_first.id).state == JobState.PENDING


@pytest.mark.django_db
@pytest.mark.skipif(not ADMIN_ACTIONS_ON_CHANGE_PAGE, reason="actions on the page: Django 6.1")
def test_cancel_from_the_change_form(client, login):
    login(*ALL_VIEW, "cancel_job")
    job = tasks.add.enqueue(1, 2)
    change = url("job", "change", job.id)
    assert "cancel_jobs" in page(client.get(change))
    response = client.post(
        change,
        {"CHANGE_FORM-action": "cancel_jobs", "_selected_action": str(job.id), "index": "0"},
        follow=True,
    )
    assert response.redirect_chain[-1][0] == change
    assert "1 cancelled, 0 skipped (already finished)." in page(response)
    assert Job.objects.get(pk=job.id).state == JobState.CANCELLED


@pytest.mark.django_db(transaction=True)
def test_retry_now_retries_waiting_jobs_and_replays_failed_ones(client, login):
    failed = failed_job()
    waiting = tasks.fail_twice.enqueue("k")
    drain(max_jobs=1, include_retries=False)  # first attempt fails; a retry waits
    row = Job.objects.get(pk=waiting.id)
    assert row.state == JobState.SCHEDULED and row.attempts == 1  # its backoff
    deferred = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    ids = [failed.id, waiting.id, deferred.id]

    login(*ALL_VIEW)
    assert "retry_jobs" not in action_names(client.get(url("job", "changelist")))
    run_action(client, "job", "retry_jobs", ids)
    assert dead_letter_of(failed).replayed_at is None

    user = login(*ALL_VIEW, "retry_job")
    response = run_action(client, "job", "retry_jobs", ids)
    assert "1 retried, 1 replayed, 1 skipped" in page(response)
    assert Job.objects.get(pk=waiting.id).run_after <= store.db_now("default")
    letter = dead_letter_of(failed)
    assert letter.replayed_by == user.get_username()
    replay = Job.objects.get(pk=letter.replay_job_id)
    assert replay.task_path == FAIL_ALWAYS and replay.state == JobState.PENDING
    assert Job.objects.get(pk=deferred.id).run_after > timezone.now()

    # The failed job's dead letter is replayed once only.
    response = run_action(client, "job", "retry_jobs", [failed.id])
    assert "0 retried, 0 replayed, 1 skipped" in page(response)
    assert Job.objects.filter(task_path=FAIL_ALWAYS).count() == 2


@pytest.mark.django_db
def test_delete_finished_keeps_live_jobs(client, login):
    live = tasks.add.enqueue(1, 1)
    done = tasks.add.enqueue(2, 2)
    services.cancel(done.id)
    login(*ALL_VIEW)
    assert "delete_finished_jobs" not in action_names(client.get(url("job", "changelist")))
    login(*ALL_VIEW, "delete_job")
    response = run_action(client, "job", "delete_finished_jobs", [live.id, done.id])
    assert "1 deleted, 1 skipped (not finished)." in page(response)
    assert list(Job.objects.values_list("pk", flat=True)) == [int(live.id)]


# --- the jobs changelist stays cheap on a big table -----------------------------------------


def _count_queries(queries) -> list[str]:
    """The statements that count: a COUNT, or (PostgreSQL) a probe run under
    EXPLAIN ANALYZE, whose plan gives the rows it read (``queries.counting``)."""
    return [
        q["sql"]
        for q in queries
        if "COUNT(" in q["sql"].upper() or q["sql"].upper().startswith("EXPLAIN (ANALYZE")
    ]


@pytest.mark.django_db
def test_job_changelist_never_counts_the_whole_table(client, login, monkeypatch):
    enqueue_many(tasks.add, [((i, i), {}) for i in range(250)])
    login(*ALL_VIEW)
    for query_string in ("", "?p=2", "?state=pending", "?q=tests.testapp", "?q=7"):
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(url("job", "changelist") + query_string)
        assert response.status_code == 200, query_string
        counts = _count_queries(ctx.captured_queries)
        assert counts, "the paginator counts (through a LIMIT)"
        for sql in counts:
            assert "LIMIT" in sql.upper(), sql
        for sql in (q["sql"] for q in ctx.captured_queries):
            if "DISTINCT" in sql.upper():
                assert "LIMIT" in sql.upper(), sql  # filter values come from a sample

    monkeypatch.setattr(CappedPaginator, "cap", 120)
    response = client.get(url("job", "changelist"))
    assert "More than 120 jobs match" in page(response)
    assert client.get(url("job", "changelist") + "?p=2").status_code == 200
    response = client.get(url("job", "changelist") + "?state=cancelled")
    assert "More than" not in page(response)


@pytest.mark.django_db
def test_the_value_filters_are_read_in_one_sample(client, login):
    """The job list's three value filters (namespace, queue, task) offer the values
    of the newest rows, read in one query for all three; a value selected but not
    in the sample is offered too."""
    tasks.add.using(queue_name="emails").enqueue(1, 2)
    tasks.echo.using(queue_name="reports").enqueue("x")
    login(*ALL_VIEW)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url("job", "changelist") + "?queue_name=elsewhere")
    samples = [q["sql"] for q in ctx.captured_queries if "SELECT DISTINCT" in q["sql"].upper()]
    assert len(samples) == 1, samples
    choices = {
        spec.title: {c["display"] for c in spec.choices(response.context["cl"])}
        for spec in response.context["cl"].filter_specs
    }
    assert {"emails", "reports", "elsewhere"} <= choices["queue name"]
    assert {"tests.testapp.tasks.add", "tests.testapp.tasks.echo"} <= choices["task path"]


@pytest.mark.django_db
def test_job_changelist_pages_merge_finished_and_live_jobs_newest_first(client, login):
    """The job list reads finished and live jobs apart (each through its own
    indexes) and merges them: every page is the next 100 of all matching jobs,
    newest first, whichever part they come from; the count adds the parts'."""
    enqueue_many(tasks.add, [((i, i), {}) for i in range(230)])
    enqueue_many(tasks.echo, [(("x",), {}) for _ in range(20)])
    ids = sorted(Job.objects.values_list("pk", flat=True))
    finished = ids[::3]  # finished and live jobs interleaved by id
    Job.objects.filter(pk__in=finished).update(state="running")
    Job.objects.filter(pk__in=finished).update(state="succeeded", finished_at=timezone.now())
    login(*ALL_VIEW)
    changelist = url("job", "changelist")

    def shown(query: str) -> tuple[list[int], int]:
        cl = client.get(changelist + query).context["cl"]
        return [job.pk for job in cl.result_list], cl.result_count

    newest = ids[::-1]
    assert shown("") == (newest[:100], 250)
    assert shown("?p=2") == (newest[100:200], 250)
    assert shown("?p=3") == (newest[200:], 250)
    assert shown("?state__exact=succeeded") == ([i for i in newest if i in finished][:100], 84)
    echo = list(Job.objects.filter(task_path=tasks.echo.module_path).values_list("pk", flat=True))
    assert shown(f"?task_path={tasks.echo.module_path}") == (sorted(echo, reverse=True), 20)
    # Shown all at once (under list_max_show_all), and sorted by another column.
    assert shown(f"?task_path={tasks.echo.module_path}&all=") == (sorted(echo, reverse=True), 20)
    by_id = client.get(changelist + "?o=0").context["cl"]  # ascending id: one query
    assert [job.pk for job in by_id.result_list] == ids[:100]


@pytest.mark.django_db
def test_job_search_by_id_and_keys(client, login):
    login(*ALL_VIEW)
    keyed = tasks.add.using(partition_key="user:abc", idempotency_key="welcome-abc").enqueue(1, 1)
    other = tasks.echo.enqueue("x")
    changelist = url("job", "changelist")

    def found(term: str) -> set[int]:
        return {j.pk for j in client.get(changelist, {"q": term}).context["cl"].result_list}

    assert found(str(other.id)) == {int(other.id)}
    assert found("user:abc") == {int(keyed.id)}
    assert found("welcome-abc") == {int(keyed.id)}
    assert found("tasks.echo") == {int(other.id)}
    assert found("no-such-thing") == set()


# --- dead letters: replay, corrected arguments, search, delete ---------------------------------


@pytest.mark.django_db(transaction=True)
def test_replay_action_needs_replay_deadletter(client, login):
    letter = dead_letter_of(failed_job())
    login(*ALL_VIEW)
    assert "replay_entries" not in action_names(client.get(url("deadletter", "changelist")))
    run_action(client, "deadletter", "replay_entries", [letter.pk])
    letter.refresh_from_db()
    assert letter.replayed_at is None
    assert Job.objects.filter(task_path=FAIL_ALWAYS).count() == 1


@pytest.mark.django_db(transaction=True)
def test_replay_action_replays_once_and_reports_each_entry(client, login):
    first = dead_letter_of(failed_job("one"))
    second = dead_letter_of(failed_job("two"))
    gone = DeadLetter.objects.create(
        task_path="tests.testapp.tasks.no_longer_exists",
        queue_name="default",
        error_class="builtins.ValueError",
        enqueued_at=timezone.now(),
    )
    user = login(*ALL_VIEW, "replay_deadletter")
    assert "replay_entries" in action_names(client.get(url("deadletter", "changelist")))

    response = run_action(client, "deadletter", "replay_entries", [first.pk])
    assert "1 replayed." in page(response)
    response = run_action(client, "deadletter", "replay_entries", [first.pk, second.pk, gone.pk])
    text = page(response)
    assert (
        f"1 replayed; 1 already replayed (#{first.pk}); 1 failed (#{gone.pk}: UnknownTask" in text
    )
    first.refresh_from_db()
    assert first.replayed_by == user.get_username() and first.replay_job_id
    # One replay job per entry, however many times it was asked for.
    assert Job.objects.filter(task_path=FAIL_ALWAYS).count() == 4
    assert Job.objects.get(pk=first.replay_job_id).args == ["one"]
    gone.refresh_from_db()
    assert gone.replayed_at is None  # the failed replay was rolled back

    # The detail page shows the history and links the new job.
    text = page(client.get(url("deadletter", "change", first.pk)))
    assert f'href="{url("job", "change", first.replay_job_id)}"' in text
    assert f"by {user.get_username()}" in text


@pytest.mark.django_db(transaction=True)
def test_replay_with_corrected_arguments(client, login):
    letter = dead_letter_of(failed_job("bad input"))
    replay_url = url("deadletter", "replay", letter.pk)

    login(*ALL_VIEW)
    assert client.get(replay_url).status_code == 403
    assert client.post(replay_url, {"args": "[]", "kwargs": "{}"}).status_code == 403

    user = login(*ALL_VIEW, "replay_deadletter")
    assert replay_url in page(client.get(url("deadletter", "change", letter.pk)))
    response = client.get(replay_url)
    assert response.status_code == 200
    assert "bad input" in page(response) and "csrfmiddlewaretoken" in page(response)

    def post(args: str, kwargs: str = "{}"):
        return client.post(replay_url, {"args": args, "kwargs": kwargs})

    assert post("[1,").context["form"].errors["args"] == ["Enter a valid JSON."]
    assert "Enter a JSON list" in post('{"a": 1}').context["form"].errors["args"][0]
    assert "Enter a JSON object" in post("[]", "[1]").context["form"].errors["kwargs"][0]
    response = post('["a", "b", "c"]')  # fail_always(message) takes one argument
    assert response.status_code == 200
    assert "cannot be called" in " ".join(response.context["form"].non_field_errors())
    letter.refresh_from_db()
    assert letter.replayed_at is None

    response = client.post(replay_url, {"args": "[]", "kwargs": '{"message": "fixed"}'})
    assert response.status_code == 302
    letter.refresh_from_db()
    assert letter.replayed_by == user.get_username()
    assert letter.replay_args == [] and letter.replay_kwargs == {"message": "fixed"}
    job = Job.objects.get(pk=letter.replay_job_id)
    assert job.args == [] and job.kwargs == {"message": "fixed"}

    # A second replay through the form is refused and enqueues nothing.
    response = post('["again"]')
    assert "Already replayed" in page(response) or "already replayed" in page(response)
    assert Job.objects.filter(task_path=FAIL_ALWAYS).count() == 2


@pytest.mark.django_db
def test_dead_letter_search_filters_and_delete(client, login):
    def letter(task_path, args, error_class="builtins.ValueError"):
        return DeadLetter.objects.create(
            task_path=task_path,
            queue_name="default",
            args=args,
            error_class=error_class,
            error_message="went wrong",
            enqueued_at=timezone.now(),
        )

    needle = letter(FAIL_ALWAYS, ["order-9931", {"nested": "Needle"}])
    other = letter("tests.testapp.tasks.add", [1, 2], "builtins.KeyError")
    login(*ALL_VIEW)
    changelist = url("deadletter", "changelist")

    def found(**params) -> set[int]:
        return {d.pk for d in client.get(changelist, params).context["cl"].result_list}

    assert found(q="order-9931") == {needle.pk}
    assert found(q="needle") == {needle.pk}  # case-insensitive, nested JSON
    assert found(q="tasks.add") == {other.pk}
    assert found(q="went wrong") == {needle.pk, other.pk}
    assert found(error_class="builtins.KeyError") == {other.pk}
    assert found(replayed="no") == {needle.pk, other.pk}
    assert found(replayed="yes") == set()

    assert "delete_entries" not in action_names(client.get(changelist))
    login(*ALL_VIEW, "delete_deadletter")
    actions = action_names(client.get(changelist))
    assert "delete_entries" in actions and "delete_selected" not in actions
    response = run_action(client, "deadletter", "delete_entries", [other.pk])
    assert "1 dead letters deleted." in page(response)
    assert list(DeadLetter.objects.values_list("pk", flat=True)) == [needle.pk]


# --- cron entries ---------------------------------------------------------------------------


def cron_form(**changes: str) -> dict[str, str]:
    data = {
        "name": "nightly",
        "schedule": "0 3 * * *",
        "timezone": "Europe/Paris",
        "task_path": FAIL_ALWAYS,
        "args": '["from cron"]',
        "kwargs": "{}",
        "queue_name": "default",
        "priority": "0",
        "misfire_policy": "skip",
        "enabled": "on",
    }
    data.update(changes)
    return data


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"schedule": "61 * * * *"}, "schedule", "is not a valid cron expression"),
        ({"schedule": "0 0 30 2 *"}, "schedule", "never fires"),
        ({"timezone": "Mars/Olympus"}, "timezone", "is not a known IANA time zone"),
        ({"task_path": "tests.testapp.tasks.nope"}, "task_path", "cannot be imported"),
        ({"task_path": "tests.testapp.tasks.quick_backoff"}, "task_path", "not a Task"),
        ({"args": "{}"}, "args", "Enter a JSON list"),
        ({"args": "[1,"}, "args", "Enter a valid JSON"),
        ({"kwargs": "[]"}, "kwargs", "Enter a JSON object"),
        ({"args": '["a", "b"]'}, "args", "cannot be called"),
        ({"misfire_policy": "sometimes"}, "misfire_policy", "Select a valid choice"),
    ],
)
def test_cron_add_form_rejects_bad_definitions(client, login, changes, field, message):
    login(superuser=True)
    response = client.post(url("cronentry", "add"), cron_form(**changes))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors and message in " ".join(errors[field]), errors
    assert not CronEntry.objects.exists()


@pytest.mark.django_db
def test_cron_add_and_change(client, login):
    login(superuser=True)
    response = client.post(url("cronentry", "add"), cron_form())
    assert response.status_code == 302
    entry = CronEntry.objects.get(name="nightly")
    assert entry.source == CronEntry.Source.ADMIN and entry.enabled
    assert entry.args == ["from cron"] and entry.kwargs == {}

    entry.next_run_at = timezone.now() + timedelta(hours=5)
    entry.save(update_fields=["next_run_at"])
    # Changing only the arguments keeps the schedule...
    client.post(url("cronentry", "change", entry.pk), cron_form(args='["other"]'))
    entry.refresh_from_db()
    assert entry.args == ["other"] and entry.next_run_at is not None
    # ...a new schedule makes the scheduler recompute the next run.
    client.post(url("cronentry", "change", entry.pk), cron_form(schedule="*/5 * * * *"))
    entry.refresh_from_db()
    assert entry.schedule == "*/5 * * * *" and entry.next_run_at is None


@pytest.mark.django_db
def test_cron_change_page_previews_fire_times_in_the_entry_time_zone(client, login):
    login("view_cronentry")
    entry = CronEntry.objects.create(
        name="nightly",
        schedule="30 2 * * *",
        timezone="Europe/Paris",
        task_path=FAIL_ALWAYS,
        source=CronEntry.Source.SETTINGS,
    )
    text = page(client.get(url("cronentry", "change", entry.pk)))
    assert "Next 5 fire times" in text
    assert text.count(" 02:30:00 CE") + text.count(" 03:00:00 CEST") == 5  # DST gap: 03:00
    assert "UTC)" in text and "In Europe/Paris, from now." in text
    assert "settings win" in text


@pytest.mark.django_db
def test_cron_run_now_enqueues_one_job_and_keeps_the_schedule(client, login):
    next_run = datetime(2030, 1, 1, 2, 0, tzinfo=UTC)
    entry = CronEntry.objects.create(
        name="nightly",
        schedule="0 3 * * *",
        timezone="UTC",
        task_path=FAIL_ALWAYS,
        args=["now"],
        next_run_at=next_run,
    )
    login("view_cronentry")
    assert "run_now" not in action_names(client.get(url("cronentry", "changelist")))
    run_action(client, "cronentry", "run_now", [entry.pk])
    assert not Job.objects.exists()

    login("view_cronentry", "change_cronentry")
    response = run_action(client, "cronentry", "run_now", [entry.pk])
    (job,) = Job.objects.all()
    text = page(response)
    assert (
        "1 enqueued: job <a" in text and f'{url("job", "change", job.pk)}">#{job.pk}</a>.' in text
    )
    assert job.task_path == FAIL_ALWAYS and job.args == ["now"]
    entry.refresh_from_db()
    # The schedule is untouched; "last run" says it ran.
    assert entry.next_run_at == next_run and entry.last_slot is None
    assert entry.last_run_at is not None and entry.last_run_at >= job.enqueued_at


@pytest.mark.django_db
def test_cron_enable_and_disable(client, login):
    entry = CronEntry.objects.create(
        name="nightly", schedule="0 3 * * *", timezone="UTC", task_path=FAIL_ALWAYS
    )
    login("view_cronentry", "change_cronentry")
    response = run_action(client, "cronentry", "disable_entries", [entry.pk])
    assert "1 disabled." in page(response)
    entry.refresh_from_db()
    assert not entry.enabled
    response = run_action(client, "cronentry", "enable_entries", [entry.pk])
    assert "1 enabled" in page(response)
    entry.refresh_from_db()
    assert entry.enabled
    # Enabled is read-only on the change form: it goes through the actions.
    assert 'name="enabled"' not in page(client.get(url("cronentry", "change", entry.pk)))


@pytest.mark.django_db
def test_workers_are_listed_read_only(client, login):
    store.worker_register("w-9", hostname="h", pid=9, queues=[], concurrency=2)
    login("view_worker")
    response = client.get(url("worker", "change", "w-9"))
    assert response.status_code == 200 and 'name="_save"' not in page(response)
    assert Worker.objects.filter(pk="w-9").exists()


@pytest.mark.django_db
def test_replay_page_of_a_missing_dead_letter_redirects(client, login):
    login(*ALL_VIEW, "replay_deadletter")
    response = client.get(url("deadletter", "replay", 999), follow=True)
    assert response.redirect_chain[-1][0] == url("deadletter", "changelist")
    assert "Dead letter 999 does not exist" in page(response)


@pytest.mark.django_db
def test_cron_delete_keeps_entries_still_defined_in_settings(client, login, settings):
    settings.DISPATCH = {**settings.DISPATCH, "CRON": {"from-settings": {"schedule": "@daily"}}}
    made_here = CronEntry.objects.create(
        name="made-here", schedule="0 3 * * *", timezone="UTC", task_path=FAIL_ALWAYS
    )
    in_settings = CronEntry.objects.create(
        name="from-settings",
        schedule="@daily",
        timezone="UTC",
        task_path=FAIL_ALWAYS,
        source=CronEntry.Source.SETTINGS,
    )
    gone_from_settings = CronEntry.objects.create(
        name="removed-from-settings",
        schedule="@daily",
        timezone="UTC",
        task_path=FAIL_ALWAYS,
        source=CronEntry.Source.SETTINGS,
        enabled=False,
    )
    ids = [made_here.pk, in_settings.pk, gone_from_settings.pk]

    login("view_cronentry", "change_cronentry")
    assert "delete_entries" not in action_names(client.get(url("cronentry", "changelist")))
    run_action(client, "cronentry", "delete_entries", ids)
    assert CronEntry.objects.count() == 3
    assert client.get(url("cronentry", "delete", made_here.pk)).status_code == 403

    login("view_cronentry", "delete_cronentry")
    changelist = client.get(url("cronentry", "changelist"))
    assert "delete_entries" in action_names(changelist)
    assert "delete_selected" not in action_names(changelist)
    text = page(run_action(client, "cronentry", "delete_entries", ids))
    assert "2 cron entries deleted; 1 kept because DISPATCH['CRON']" in text
    assert list(CronEntry.objects.values_list("name", flat=True)) == ["from-settings"]
    # No per-object delete page: it would bypass the service.
    assert client.get(url("cronentry", "delete", in_settings.pk)).status_code == 403


# --- beside a busy worker (SQLite's single writer) ------------------------------------------


def post_change_form_action(client, model: str, pk: int, action: str) -> str:
    """Run ``action`` from the object's change page; the page it redirects to, as text."""
    change = url(model, "change", pk)
    response = client.post(
        change, {"CHANGE_FORM-action": action, "_selected_action": str(pk), "index": "0"}
    )
    assert response.status_code == 302 and response["Location"] == change, (model, action)
    return page(client.get(change))


@pytest.mark.skipif(not ADMIN_ACTIONS_ON_CHANGE_PAGE, reason="actions on the page: Django 6.1")
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_change_page_actions_succeed_while_a_worker_commits(client, login, start_worker):
    """Every change-page action succeeds while a worker drains jobs beside it.

    Django runs change-page actions inside ``changeform_view``'s transaction,
    after reading the object. On SQLite such a transaction cannot later
    become a writer if a worker committed in between ("database is locked",
    at once, no busy timeout), so without taking the write lock first most
    of these requests failed while a worker was busy. A failing action
    raises here (the test client re-raises the view's exception).
    """
    rounds = 3
    to_replay = [tasks.fail_always.enqueue(f"letter {i}") for i in range(rounds)]
    to_retry = [tasks.fail_always.enqueue(f"job {i}") for i in range(rounds)]
    drain()
    letters = [dead_letter_of(result) for result in to_replay]
    later = timezone.now() + timedelta(hours=1)
    deferred = [tasks.noop.using(run_after=later).enqueue(i) for i in range(rounds * 3)]
    entry = CronEntry.objects.create(
        name="busy", schedule="0 3 * * *", timezone="UTC", task_path="tests.testapp.tasks.noop"
    )
    login(superuser=True)

    def succeeded() -> int:
        return Job.objects.filter(state=JobState.SUCCEEDED).count()

    enqueue_many(tasks.noop, [([i], {}) for i in range(1000)])
    worker = start_worker("--concurrency", "4")
    wait_until(lambda: succeeded() or worker.popen.poll() is not None, what="the worker")
    assert worker.popen.poll() is None, worker.output()
    done_before = succeeded()
    for i in range(rounds):
        enqueue_many(tasks.noop, [([i], {}) for i in range(300)])  # the worker stays busy
        text = post_change_form_action(client, "job", deferred[i].id, "cancel_jobs")
        assert "1 cancelled, 0 skipped" in text
        text = post_change_form_action(client, "job", to_retry[i].id, "retry_jobs")
        assert "0 retried, 1 replayed, 0 skipped." in text
        text = post_change_form_action(client, "deadletter", letters[i].pk, "replay_entries")
        assert "1 replayed." in text
        text = post_change_form_action(client, "cronentry", entry.pk, "run_now")
        assert "1 enqueued: job" in text
        text = post_change_form_action(client, "cronentry", entry.pk, "disable_entries")
        assert "1 disabled." in text
        text = post_change_form_action(client, "cronentry", entry.pk, "enable_entries")
        assert "1 enabled" in text
        response = client.post(  # the change form's own Save button
            url("cronentry", "change", entry.pk),
            cron_form(name="busy", task_path="tests.testapp.tasks.noop", args=f"[{i}]"),
        )
        assert response.status_code == 302, page(response)
        pair = [deferred[rounds + 2 * i].id, deferred[rounds + 2 * i + 1].id]
        assert "2 cancelled, 0 skipped" in page(run_action(client, "job", "cancel_jobs", pair))
    # The worker committed all along: the requests really ran beside it.
    assert succeeded() - done_before >= rounds
    assert CronEntry.objects.get(pk=entry.pk).args == [rounds - 1]
    assert not Job.objects.filter(pk__in=[j.id for j in deferred]).exclude(state=JobState.CANCELLED)


def test_atomic_requests_on_sqlite_are_warned_about_without_immediate(monkeypatch):
    """Under ATOMIC_REQUESTS the admin's write-lock-first comes too late on SQLite."""
    db = connections["default"]
    on_sqlite = db.vendor == "sqlite"

    def warned() -> bool:
        return "django_dispatch.W014" in {m.id for m in check_dispatch_settings()}

    assert not warned()
    monkeypatch.setitem(db.settings_dict, "ATOMIC_REQUESTS", True)
    assert warned() == on_sqlite
    options = {**db.settings_dict.get("OPTIONS", {}), "transaction_mode": "IMMEDIATE"}
    monkeypatch.setitem(db.settings_dict, "OPTIONS", options)
    assert not warned()


@pytest.mark.django_db
@pytest.mark.parametrize(("cap", "count", "capped", "statements"), [
    (1000, 250, False, 2),  # under the cap: every part counted, exactly
    (200, 200, True, 2),  # the finished 90, then the live part only up to 111
    (50, 50, True, 1),  # the finished part alone passes the cap: the live one is not read
])  # fmt: skip
def test_the_parts_are_counted_only_as_far_as_the_cap_needs(
    monkeypatch, cap, count, capped, statements
):
    """The job list's count adds its parts' counts, each read only up to what the cap
    still needs: the same count and "more than", fewer index entries read."""
    enqueue_many(tasks.add, [((i, i), {}) for i in range(250)])
    finished = sorted(Job.objects.values_list("pk", flat=True))[:90]
    Job.objects.filter(pk__in=finished).update(state="running")
    Job.objects.filter(pk__in=finished).update(state="succeeded", finished_at=timezone.now())
    rows = Job.objects.order_by("-pk")
    monkeypatch.setattr(CappedPaginator, "cap", cap)
    paginator = CappedPaginator(rows, 100)
    paginator.parts = [rows.filter(state__in=FINISHED_STATES), rows.filter(state__in=LIVE_STATES)]
    with CaptureQueriesContext(connection) as ctx:
        assert paginator.count == count
    assert paginator.capped is capped
    assert len(_count_queries(ctx.captured_queries)) == statements
