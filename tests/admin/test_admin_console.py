"""The operations overview: what it shows, and that its cost does not grow with history.

The page is opened during incidents, when the job table is largest, so the
cost tests fill it with 1,000,000 finished jobs (one INSERT … SELECT
generate_series on PostgreSQL) and check what the database will do: the
number of queries is fixed, and no query's plan reads the job table
sequentially. A wall time would be flaky on a shared machine; a plan is not.
"""

from __future__ import annotations

import html
import importlib.util
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_dispatch.models import CronEntry, Job, Worker
from django_dispatch.queries import console, console_timings
from django_dispatch.store.base import LIVE_JOBS_BY_STATE
from django_dispatch.testing import drain
from tests.conftest import postgres_only
from tests.testapp import tasks

OVERVIEW = "admin:django_dispatch_job_overview"
#: live counts (4: pending, blocked, running, scheduled), finished per
#: minute, timing sample, leader, workers, dead letters, cron, namespaces:
#: one each; and the paused queues where flow control is installed.
OVERVIEW_QUERIES = 11 + (importlib.util.find_spec("django_dispatch.store.flow") is not None)


def page(response) -> str:
    return html.unescape(response.content.decode())


@pytest.fixture
def staff(login):
    """The console tests' name for the suite's ``login`` fixture."""
    return login


def make_incident() -> dict[str, object]:
    """Finished work on "default", a backlog on "emails" that no worker serves."""
    for i in range(4):
        tasks.add.enqueue(i, 1)
    tasks.fail_always.enqueue("boom")
    drain()
    for _ in range(3):
        tasks.echo.enqueue("hello")  # queue "emails"
    tasks.add.using(run_after=timezone.now() + timedelta(hours=2)).enqueue(1, 2)
    Worker.objects.create(
        id="w-default", hostname="box-1", pid=42, queues=["default"], concurrency=4
    )
    entry = CronEntry.objects.create(
        name="nightly",
        schedule="0 3 * * *",
        timezone="UTC",
        task_path="tests.testapp.tasks.add",
        args=[1, 2],
        next_run_at=timezone.now() + timedelta(hours=3),
    )
    return {"entry": entry}


@pytest.mark.django_db(transaction=True)
def test_overview_counts_queues_and_flags_the_unserved_one():
    make_incident()
    data = console.overview()
    queues = {q.name: q for q in data.queues}
    assert queues["default"].succeeded == 4
    assert queues["default"].failed == 1
    assert queues["default"].waiting == 0 and queues["default"].deferred == 1
    assert queues["emails"].waiting == 3 and queues["emails"].pending == 3
    assert queues["emails"].oldest_waiting is not None
    # The only worker takes "default": "emails" has work and nobody to do it.
    assert queues["emails"].unserved and not queues["default"].unserved
    assert data.queues[0].name == "emails"  # the queue needing action comes first
    assert sum(ok + failed for _, ok, failed in data.per_minute) == 5
    assert queues["default"].run_p50 is not None and queues["default"].wait_p95 is not None
    assert data.dead_letters == 1
    assert [e.name for e in data.cron] == ["nightly"]
    assert [w.worker.pk for w in data.workers] == ["w-default"]


@pytest.mark.django_db
def test_wait_and_run_percentiles_are_the_jobs_own():
    """Wait: from enqueue (or the later deferral) to the first start; run: the last
    attempt; a start before the deferral (a retry run early) waits 0, not less."""
    now = timezone.now()

    def finished(wait: float, run: float, deferred: float = 0.0, attempt: float = 0.0) -> Job:
        enqueued = now - timedelta(minutes=10)
        started = enqueued + timedelta(seconds=deferred + wait)
        return Job(
            task_path="tests.testapp.tasks.add",
            queue_name="timed",
            state="succeeded",
            args=[],
            kwargs={},
            enqueued_at=enqueued,
            deferred_until=enqueued + timedelta(seconds=deferred) if deferred else None,
            started_at=started,
            last_attempted_at=started + timedelta(seconds=attempt) if attempt else None,
            finished_at=started + timedelta(seconds=attempt + run),
        )

    Job.objects.bulk_create(
        [
            finished(wait=2.0, run=3.0),
            finished(wait=4.0, run=1.5, deferred=60.0),
            finished(wait=6.0, run=0.25, attempt=30.0),
            finished(wait=-5.0, run=9.0, deferred=60.0),
        ]
    )
    queue = {q.name: q for q in console.overview().queues}["timed"]
    # Waits 0 (clamped), 2, 4, 6; runs 0.25, 1.5, 3, 9 (nearest rank).
    assert (queue.wait_p50, queue.wait_p95) == (pytest.approx(2.0), pytest.approx(6.0))
    assert (queue.run_p50, queue.run_p95) == (pytest.approx(1.5), pytest.approx(9.0))


@postgres_only
@pytest.mark.django_db
def test_postgresqls_percentiles_are_the_nearest_ranks_of_the_same_sample():
    """On PostgreSQL the percentiles are worked out by the database (``percentile_disc``):
    for every queue they are the nearest ranks ``percentile`` takes of the sample's
    durations, negative waits counted as 0."""
    now = timezone.now()
    made = []
    for n in range(97):
        enqueued = now - timedelta(minutes=30)
        started = enqueued + timedelta(seconds=((n * 37) % 101) / 10 - 1.0)  # some < 0
        made.append(
            Job(
                task_path="tests.testapp.tasks.add",
                queue_name=("a", "b", "c")[n % 3] if n < 90 else "d",
                state="succeeded" if n % 5 else "failed",
                args=[],
                kwargs={},
                enqueued_at=enqueued,
                started_at=started,
                finished_at=started + timedelta(seconds=((n * 53) % 89) / 7),
            )
        )
    Job.objects.bulk_create(made)
    since = now - console.WINDOW
    rows = console.QueueRows()
    console_timings.add_timings(rows, "", since, "default")
    waits: dict[str, list[float]] = {}
    runs: dict[str, list[float]] = {}
    for queue, wait, run in console_timings.timing_sample("", since, "default"):
        waits.setdefault(queue, []).append(max(wait.total_seconds(), 0.0))
        runs.setdefault(queue, []).append(max(run.total_seconds(), 0.0))
    assert sorted(rows) == sorted(waits) == ["a", "b", "c", "d"]
    for name, row in rows.items():
        p = console_timings.percentile
        assert (row.wait_p50, row.wait_p95) == (p(waits[name], 0.5), p(waits[name], 0.95))
        assert (row.run_p50, row.run_p95) == (p(runs[name], 0.5), p(runs[name], 0.95))
    assert rows["a"].wait_p50 != rows["a"].wait_p95  # not all alike: the ranks are tested


@postgres_only
@pytest.mark.django_db
def test_postgresqls_one_pass_live_counts_are_the_joined_counts():
    """On PostgreSQL the live counts group the capped rows as they are read; they are
    what the ORM's join of the capped ids back to their rows counts."""
    now = timezone.now()
    made = []
    for n in range(40):
        made.append(
            Job(
                task_path="tests.testapp.tasks.echo",
                queue_name=("default", "emails")[n % 2],
                args=[n],
                kwargs={},
                partition_key=f"user:{n % 3}" if n % 4 == 0 else None,
                run_after=now + timedelta(hours=1) if n % 5 == 0 else now - timedelta(seconds=n),
            )
        )
    Job.objects.bulk_create(made)

    def ordered(found):
        return sorted(
            (tuple(r[k] for k in ("queue_name", "n", "due", "oldest", "keyed_due", "keys_due")))
            for r in found
        )

    for state in LIVE_JOBS_BY_STATE:
        live = console.jobs("", "default").filter(LIVE_JOBS_BY_STATE[state]).order_by()
        one_pass = console.live_counts_in_one_pass(live, now, "default")
        assert ordered(one_pass) == ordered(console.live_counts_joined(live, now, "default"))
    pending = ordered(console.live_counts("", "pending", now, "default"))
    assert [row[:3] for row in pending] == [("default", 20, 16), ("emails", 20, 16)]
    assert pending[0][4:] == (8, 3)  # n = 4, 8, …, 36 but the deferred 20: 3 keys


@pytest.mark.django_db
def test_keyed_jobs_behind_another_of_their_key_count_as_blocked():
    """A worker marks them blocked only when it next looks; the operator sees it now."""
    for n in range(3):
        tasks.echo.using(partition_key="user:1").enqueue(n)
    tasks.echo.using(partition_key="user:2").enqueue("x")
    tasks.echo.enqueue("unkeyed")
    (emails,) = [q for q in console.overview().queues if q.name == "emails"]
    assert (emails.waiting, emails.blocked, emails.pending) == (3, 2, 3)
    assert Job.objects.filter(state="blocked").count() == 0  # none marked yet


def set_aside_by_limits() -> dict[str, list[int]]:
    """Jobs blocked by a task's concurrency limit (key "customer:42", cap 3) and by
    queue "capq"'s (cap 1), through a real claim; run inside ``limited_queue()``."""
    from django_dispatch import store
    from django_dispatch.runtime import flow_cache
    from tests.testapp import flow_tasks

    flow_cache.forget_paused()
    keyed = [
        int(flow_tasks.capped.using(concurrency_key="customer:42").enqueue(f"t{i}").id)
        for i in range(5)
    ]
    queued = [int(flow_tasks.mark.using(queue_name="capq").enqueue(f"q{i}").id) for i in range(4)]
    claimed = store.jobs_claim(worker_id="w", queues=(), limit=20, lease_seconds=30)
    assert {c.id for c in claimed} == {*keyed[:3], queued[0]}
    return {"keyed": keyed[3:], "queued": queued[1:]}


def limited_queue():
    from django.conf import settings
    from django.test.utils import override_settings

    return override_settings(DISPATCH={**settings.DISPATCH, "QUEUES": {"capq": {"concurrency": 1}}})


@pytest.mark.django_db(transaction=True)
def test_jobs_set_aside_by_a_concurrency_or_queue_limit_count_as_blocked():
    """Review finding (wave 5): the blocked count took only partitioned jobs, so
    a backlog set aside by a limit showed as neither pending nor blocked."""
    with limited_queue():
        set_aside_by_limits()
        queues = {q.name: q for q in console.overview().queues}
    assert (queues["capq"].running, queues["capq"].blocked, queues["capq"].pending) == (1, 3, 0)
    assert (queues["default"].running, queues["default"].blocked) == (3, 2)
    assert queues["default"].pending == 0


@pytest.mark.django_db(transaction=True)
def test_overview_page_renders_for_a_view_only_user(client, staff):
    make_incident()
    staff("view_job")
    response = client.get(reverse(OVERVIEW))
    assert response.status_code == 200
    text = page(response)
    assert 'data-queue="emails"' in text and "no worker" in text
    assert 'class="dispatch-unserved"' in text
    assert "<svg" in text and "dispatch-bar-failed" in text
    assert "django_dispatch/console.js" in text
    assert "box-1" in text and "?worker_id__exact=w-default&state__exact=running" in text
    # The app index links to it.
    index = page(client.get(reverse("admin:app_list", args=["django_dispatch"])))
    assert reverse(OVERVIEW) in index


@pytest.mark.django_db
def test_overview_needs_view_job_permission(client, staff):
    response = client.get(reverse(OVERVIEW))
    assert response.status_code == 302 and "/login/" in response["Location"]
    staff("view_deadletter")
    assert client.get(reverse(OVERVIEW)).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_overview_query_count_does_not_grow_with_the_data():
    with CaptureQueriesContext(connection) as empty:
        console.overview()
    make_incident()
    with CaptureQueriesContext(connection) as busy:
        console.overview()
    assert len(empty) == len(busy) == OVERVIEW_QUERIES, [q["sql"] for q in busy]


# --- 1,000,000 finished jobs on PostgreSQL -----------------------------------------


def insert_finished_jobs(count: int) -> None:
    """``count`` finished jobs over the last 30 days, most in the past, in one statement.

    Columns are taken from the model, so a field added later (with its
    default) does not break the statement: named columns get generated
    values, nullable ones NULL, the rest their default.
    """
    generated = {
        "namespace": "''",
        "task_path": "'tests.testapp.tasks.add'",
        "queue_name": "(ARRAY['default','emails','reports'])[1 + i %% 3]",
        "state": "CASE WHEN i %% 50 = 0 THEN 'failed' ELSE 'succeeded' END",
        "enqueued_at": "now() - (i || ' seconds')::interval * 2.5",
        "run_after": "now() - (i || ' seconds')::interval * 2.5",
        "started_at": "now() - (i || ' seconds')::interval * 2.5 + interval '1 second'",
        "last_attempted_at": "now() - (i || ' seconds')::interval * 2.5 + interval '1 second'",
        "finished_at": "now() - (i || ' seconds')::interval * 2.5 + interval '2 seconds'",
        "attempts": "1",
    }
    columns, values, params = [], [], []
    for field in Job._meta.concrete_fields:
        if field.primary_key:
            continue
        if field.column in generated:
            columns.append(field.column)
            values.append(generated[field.column])
        elif field.null or field.has_db_default():
            continue
        else:
            columns.append(field.column)
            values.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    sql = (
        f"INSERT INTO {Job._meta.db_table} ({', '.join(columns)}) "
        f"SELECT {', '.join(values)} FROM generate_series(1, {count}) AS i"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        cursor.execute(f"ANALYZE {Job._meta.db_table}")


def plan(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_overview_plans_use_indexes_with_a_million_finished_jobs():
    make_incident()  # first: its drain() would run retention over the million
    insert_finished_jobs(1_000_000)
    with CaptureQueriesContext(connection) as queries:
        data = console.overview()
    assert len(queries) == OVERVIEW_QUERIES
    # The window holds about 1,440 of the million (one every 2.5 s for an hour).
    default = next(q for q in data.queues if q.name == "default")
    assert 400 < default.succeeded < 600
    job_table = Job._meta.db_table
    checked = 0
    for query in queries:
        if job_table not in query["sql"]:
            continue
        checked += 1
        explained = plan(query["sql"])
        assert not re.search(rf"Seq Scan on {job_table}\b", explained), (
            f"{query['sql']}\n{explained}"
        )
        assert "Index" in explained, explained
    assert checked == 6  # four live counts, the window's counts, the timing sample


# --- pause / resume from the overview ------------------------------------------------

PAUSE = "admin:django_dispatch_job_overview_pause"
PAUSE_PERMS = ("view_job", "pause_queue")


def paused() -> set[str]:
    return console.paused_queues("") or set()


@pytest.mark.django_db
def test_an_operator_pauses_and_resumes_a_queue_from_the_overview(client, staff):
    from django.contrib.admin.models import LogEntry

    tasks.echo.enqueue("hello")
    staff(*PAUSE_PERMS)
    text = page(client.get(reverse(OVERVIEW)))
    assert 'data-queue-control="emails"' in text and ">Pause<" in text
    response = client.post(reverse(PAUSE), {"queue": "emails", "op": "pause"}, follow=True)
    assert paused() == {"emails"}
    assert "Queue 'emails' paused." in page(response)
    assert ">Resume<" in page(response) and "paused</span>" in page(response)
    client.post(reverse(PAUSE), {"queue": "emails", "op": "resume"})
    assert paused() == set()
    messages = list(LogEntry.objects.order_by("pk").values_list("change_message", flat=True))
    assert messages == [
        "Paused queue 'emails' (namespace '') from the overview.",
        "Resumed queue 'emails' (namespace '') from the overview.",
    ]


@pytest.mark.django_db
def test_pause_control_refuses_view_only_anonymous_and_forged_requests(client, staff):
    from django.test import Client

    tasks.echo.enqueue("hello")
    data = {"queue": "emails", "op": "pause"}
    # Anonymous: to the login page, nothing paused.
    response = client.post(reverse(PAUSE), data)
    assert response.status_code == 302 and "/login/" in response["Location"]
    # View-only: no button, and a forged POST is refused.
    user = staff("view_job")
    assert 'data-queue-control="emails"' not in page(client.get(reverse(OVERVIEW)))
    assert client.post(reverse(PAUSE), data).status_code == 403
    # GET never acts.
    user.user_permissions.add(*Permission.objects.filter(codename__in=["pause_queue"]))
    assert client.get(reverse(PAUSE), data).status_code == 405
    # Without the CSRF token: refused.
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(reverse(PAUSE), data).status_code == 403
    assert paused() == set()
    # With everything right it acts (so the refusals above were not vacuous).
    assert client.post(reverse(PAUSE), data).status_code == 302
    assert paused() == {"emails"}


@postgres_only
@pytest.mark.django_db
def test_postgresqls_chart_minutes_are_the_truncated_minutes():
    """On PostgreSQL the chart's minutes are numbers the server works out; they are
    the bars the ORM's truncated timestamps give, at a minute's edges too."""
    since = timezone.now().replace(second=30, microsecond=250_000) - timedelta(minutes=61)
    edge = since.replace(second=0, microsecond=0)
    finished = [since, since + timedelta(microseconds=1)]
    for minutes in (1, 2, 30, 59, 60):
        at = edge + timedelta(minutes=minutes)
        finished += [at - timedelta(microseconds=1), at, at + timedelta(microseconds=1)]
    Job.objects.bulk_create(
        Job(
            task_path="tests.testapp.tasks.add",
            queue_name=("a", "b")[n % 2],
            state=("succeeded", "failed")[n % 3 == 0],
            args=[],
            kwargs={},
            finished_at=at,
        )
        for n, at in enumerate(finished)
    )
    by_server = sorted(console_timings.finished_by_minute("", since, "default"))
    by_orm = sorted(
        (r["queue_name"], r["state"], (r["minute"] - edge) // timedelta(minutes=1), r["n"])
        for r in console_timings.finished_per_minute("", since, "default")
    )
    assert by_server == by_orm
    assert sum(n for *_, n in by_server) == len(finished)
    assert {minute for _, _, minute, _ in by_server} == {0, 1, 2, 29, 30, 58, 59, 60}
