"""History at scale: every operator read's cost is bounded by its page, its cap or the
live work, never by the number of finished rows; and the purge deletes in batches.

The tables are scaled down (30,000 finished jobs, their dead letters, 3,000
workflow runs, made on the server with generate_series and ANALYZEd) and the
bounds are in rows read, from ``EXPLAIN ANALYZE`` of every statement a read
ran: a read that scanned the history would read all 30,000 rows, a bounded
one reads its page (100), its cap, or the live jobs. Wall times are measured
in ``make bench`` (benchmarks/history.py at 10,000,000 rows), never here.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import Subquery
from django.utils import timezone

from django_dispatch import dead_letters, jobs, workflows
from django_dispatch.admin.common import COUNT_CAP, FILTER_SAMPLE
from django_dispatch.conf import get_settings
from django_dispatch.models import DeadLetter, Job, WorkflowRun
from django_dispatch.queries import counting
from django_dispatch.queries.status import snapshot
from django_dispatch.store.dead_letters import purge_past_retention
from tests.conftest import postgres_only
from tests.store.helpers import statements

HISTORY = 30_000
RUNS = 3_000
#: Live jobs beside the history (their reads are bounded by them, not by it).
LIVE = 50
TABLES = {m._meta.db_table for m in (Job, DeadLetter, WorkflowRun)}
ADD, ECHO = "tests.testapp.tasks.add", "tests.testapp.tasks.echo"

# --- the history, made on the server ---------------------------------------------------------


def _insert(model, generated: dict[str, str], source: str) -> None:
    """INSERT … SELECT: ``generated`` columns as given, the other required ones their
    model default (a field added later does not break it)."""
    columns, values, params = [], [], []
    for field in model._meta.concrete_fields:
        if field.column in generated:
            columns.append(field.column)
            values.append(generated[field.column])
        elif not (field.primary_key or field.null or field.has_db_default()):
            columns.append(field.column)
            values.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {model._meta.db_table} ({', '.join(columns)}) "
            f"SELECT {', '.join(values)} {source}",
            params,
        )


def make_history() -> None:
    """30,000 finished jobs over 30 days up to 3 hours ago (1 in 50 failed, each with
    its dead letter; 1 in 100 of queue "emails" and task echo, all failed), 3,000
    runs (1 in 100 stuck), 50 live jobs."""
    finished = "now() - make_interval(days => 30) + make_interval(secs => i * 86.0)"
    _insert(
        Job,
        {
            "namespace": "''",
            "task_path": f"CASE WHEN i %% 100 = 50 THEN '{ECHO}' ELSE '{ADD}' END",
            "queue_name": "CASE WHEN i %% 100 = 50 THEN 'emails' ELSE 'default' END",
            "state": "CASE WHEN i %% 50 = 0 THEN 'failed' ELSE 'succeeded' END",
            "enqueued_at": f"{finished} - interval '2 seconds'",
            "run_after": f"{finished} - interval '2 seconds'",
            "started_at": f"{finished} - interval '1 second'",
            "finished_at": finished,
            "attempts": "1",
        },
        f"FROM generate_series(1, {HISTORY}) AS i",
    )
    _insert(
        DeadLetter,
        {
            "job_id": "j.id",
            "namespace": "''",
            "task_path": "j.task_path",
            "queue_name": "j.queue_name",
            "error_class": "'builtins.ValueError'",
            "error_message": "'boom'",
            "enqueued_at": "j.enqueued_at",
            "failed_at": "j.finished_at",
        },
        f"FROM {Job._meta.db_table} j WHERE j.state = 'failed' ORDER BY j.id",
    )
    _insert(
        WorkflowRun,
        {
            "namespace": "''",
            "name": "'signup'",
            "state": "CASE WHEN i %% 100 = 0 THEN 'stuck' ELSE 'succeeded' END",
            "finished_at": "now()",
        },
        f"FROM generate_series(1, {RUNS}) AS i",
    )
    Job.objects.bulk_create(
        Job(task_path=ADD, queue_name="default", args=[], kwargs={}) for _ in range(LIVE)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {', '.join(sorted(TABLES))}")


@pytest.fixture
def history(transactional_db):
    """The history, committed: the test's end truncates the tables, which resets
    their statistics. Rolled back instead, the pages it filled would stay, and
    with them the planner's estimate of 30,000 rows in the next tests' tables."""
    make_history()


# --- reading what a read read -----------------------------------------------------------------

#: The prefix of a count's probe (``queries.counting.probe``).
PROBE = re.compile(r"^\s*EXPLAIN \(ANALYZE[^)]*\)\s*", re.IGNORECASE)


def rows_read(seen) -> dict[str, int]:
    """The most rows any one of the ``seen`` statements read from each history table
    (rows its scans of the table produced plus those they filtered out), and
    how many scans of them were sequential (key "seq scans").

    Planned with sequential scans, hash and merge joins off: on 30,000 rows
    reading a table whole can rightly be cheaper than an index (on 10,000,000
    it cannot, and benchmarks/history.py times the plans the planner picks
    there); what is checked is that an index serves each read and its LIMIT
    stops it. A read no index can serve still shows its Seq Scan.
    """
    worst = dict.fromkeys(TABLES, 0)
    worst["seq scans"] = 0
    with transaction.atomic():
        with connection.cursor() as cursor:
            for method in ("seqscan", "hashjoin", "mergejoin"):
                cursor.execute(f"SET LOCAL enable_{method} = off")
            for sql, params in seen:
                # A count's probe runs its SELECT under EXPLAIN ANALYZE: what it read
                # is that SELECT's reads.
                sql = PROBE.sub("", sql, count=1)
                if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
                    continue  # EXPLAINs (the estimates), SAVEPOINTs, the session's writes
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                plan = cursor.fetchone()[0]
                plan = plan if isinstance(plan, list) else json.loads(plan)
                read: dict[str, int] = {}
                _add_reads(plan[0]["Plan"], read)
                for table, n in read.items():
                    if table == "seq scans":
                        worst[table] += n
                    else:
                        worst[table] = max(worst[table], n)
        transaction.set_rollback(True)
    return worst


def _add_reads(node, read: dict[str, int]) -> None:
    table = node.get("Relation Name")
    if table in TABLES:
        loops = node.get("Actual Loops", 1)
        n = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
        read[table] = read.get(table, 0) + int(n * loops)
        if node.get("Node Type") == "Seq Scan":
            read["seq scans"] = read.get("seq scans", 0) + 1
    for child in node.get("Plans", []):
        _add_reads(child, read)


def reading(call):
    """Run ``call``; return what it answered and the rows its statements read."""
    with statements(connection) as seen:
        answer = call()
    return answer, rows_read(seen)


JOB, LETTER, RUN = (m._meta.db_table for m in (Job, DeadLetter, WorkflowRun))

# --- the list functions -----------------------------------------------------------------------


LIST_CALLS = [
    lambda: jobs.list(),
    lambda: jobs.list(state="failed"),
    lambda: jobs.list(queue="emails"),
    lambda: jobs.list(task=ECHO),
    lambda: dead_letters.list(),
    lambda: dead_letters.list(task=ECHO),
    lambda: workflows.list_runs(),
    lambda: workflows.list_runs(state="stuck"),  # 30 of them: a short page
]


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "call, table",
    list(zip(LIST_CALLS, [JOB] * 4 + [LETTER] * 2 + [RUN] * 2, strict=True)),
    ids=[
        "jobs",
        "jobs-failed",
        "jobs-queue",
        "jobs-task",
        "dead-letters",
        "dead-letters-task",
        "runs",
        "runs-stuck",
    ],
)
def test_a_page_reads_its_page_not_the_history(history, call, table):
    """A page of 100 reads about 100 index entries per part (the finished states'
    parts, the live part): an index scan in id order that stops at the LIMIT."""
    page, read = reading(call)
    assert len(page) == 100 or (call is LIST_CALLS[-1] and len(page) == RUNS // 100)
    assert read["seq scans"] == 0, read
    # Each of the (at most four) parts of a job page stops at 100; a page of
    # a filtered kind skips no more than what its index holds of other kinds.
    assert 0 < read[table] <= 4 * 100 + LIVE, read


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "count, exact",
    [
        (lambda **kw: jobs.count(**kw), HISTORY + LIVE),
        (lambda **kw: jobs.count(state="succeeded", **kw), HISTORY - HISTORY // 50),
        (lambda **kw: jobs.count(queue="default", **kw), HISTORY - HISTORY // 100 + LIVE),
        (lambda **kw: dead_letters.count(replayed=False, **kw), HISTORY // 50),
        (lambda **kw: workflows.count_runs(**kw), RUNS),
    ],
    ids=["jobs", "jobs-succeeded", "jobs-queue", "dead-letters", "runs"],
)
def test_a_count_past_the_cap_is_the_planners_estimate_and_reads_no_rows(
    history, settings, count, exact
):
    """Above COUNT_EXACT_MAX a count of the history is the planner's estimate: a
    probe of one past the cap, then one EXPLAIN; within a tenth of the truth on
    ANALYZEd tables. ``exact=True`` counts."""
    settings.DISPATCH = {"COUNT_EXACT_MAX": 100}
    about, read = reading(count)
    assert abs(about - exact) <= exact / 10, (about, exact)
    # The history's probe reads one past the cap (a filtered index scan a few
    # times that), never the 30,000; the live jobs are counted.
    assert read[JOB] <= 4 * 101 + LIVE and read[LETTER] <= 4 * 101 and read[RUN] <= 4 * 101, read
    assert count(exact=True) == exact


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_probe_and_its_estimate_are_one_statement(history, settings):
    """A count of the history asks once: its probe runs under EXPLAIN ANALYZE, which
    gives the rows it counted (up to one past the cap) and the planner's estimate
    of them all. Only the live jobs' count is a second statement."""
    runs = WorkflowRun.objects.filter(namespace="")
    counted, estimate = counting.probe(runs, 100)
    assert counted == 101 and estimate is not None and abs(estimate - RUNS) <= RUNS / 10
    assert counting.probe(runs, RUNS)[0] == RUNS  # under the cap: every row, exactly
    assert counting.probe(runs.filter(state="running"), 100)[0] == 0
    settings.DISPATCH = {"COUNT_EXACT_MAX": 100}
    for call, asked in [
        (dead_letters.count, 1),
        (workflows.count_runs, 1),
        (lambda: jobs.count(state="succeeded"), 1),
        (jobs.count, 2),
    ]:
        with statements(connection) as seen:
            assert call() > 100
        assert len(seen) == asked, seen


def _scans(node) -> list[tuple[str, str | None]]:
    """Each scan of a plan: its node type and the index it walks (None: the table)."""
    found = [(node["Node Type"], node.get("Index Name"))] if "Relation Name" in node else []
    for child in node.get("Plans", []):
        found += _scans(child)
    return found


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_count_of_every_run_walks_an_index_not_the_table(history, settings):
    """Every run of the namespace matches ``count_runs()``, so the planner would
    count them off the table's first pages, which a table past a quarter of
    shared_buffers reads from the OS on every call (its scans go through a
    ring of buffers): the probe is ordered as ``dispatch_wfrun_list_state``
    is, and that index's walk reaches the LIMIT first. Planned as the planner
    likes, sequential scans allowed; the answer is the same in any order."""
    settings.DISPATCH = {"COUNT_EXACT_MAX": 100}
    with statements(connection) as seen:
        assert workflows.count_runs() > 100
    [(sql, params)] = seen
    with connection.cursor() as cursor:
        cursor.execute(PROBE.sub("EXPLAIN (FORMAT JSON) ", sql, count=1), params)
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    assert _scans(plan[0]["Plan"]) in (
        [("Index Only Scan", "dispatch_wfrun_list_state")],
        [("Index Scan", "dispatch_wfrun_list_state")],
    ), plan
    settings.DISPATCH = {}
    assert workflows.count_runs() == RUNS == workflows.count_runs(exact=True)


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_probe_whose_filter_has_a_subquery_reads_the_limits_input(history):
    """An uncorrelated subquery in the filter is an InitPlan, listed beside the
    Limit's input in the plan: the estimate is the input's, not the InitPlan's
    one row (which, below the rows counted, would be taken for stale
    statistics and make the count a full COUNT)."""
    first = WorkflowRun.objects.filter(namespace="").order_by("pk").values("namespace")[:1]
    runs = WorkflowRun.objects.filter(namespace=Subquery(first))
    counted, estimate = counting.probe(runs, 100)
    assert counted == 101 and estimate is not None and abs(estimate - RUNS) <= RUNS / 10


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_count_under_the_cap_is_exact_and_reads_at_most_the_cap(history, settings):
    """Counts the planner expects under the cap are made exactly, through a LIMIT of
    one past the cap; a wrong guess costs at most those rows."""
    cap = get_settings().COUNT_EXACT_MAX
    for call, expected in [
        (lambda: jobs.count(state="failed"), HISTORY // 50),
        (lambda: jobs.count(task=ECHO), HISTORY // 100),
        (lambda: jobs.count(state="pending"), LIVE),
        (lambda: workflows.count_runs(state="stuck"), RUNS // 100),
    ]:
        answer, read = reading(call)
        assert answer == expected
        assert read["seq scans"] == 0 and read[JOB] <= cap + 1, read


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_count_the_planner_underestimates_is_still_exact(history, settings):
    """The statistics say a handful of ``echo`` jobs; 2,000 more are added without
    ANALYZE: the count reaches the cap, so the estimate is no answer: it counts."""
    settings.DISPATCH = {"COUNT_EXACT_MAX": 1000}
    before = counting.estimated_rows(Job.objects.filter(task_path=ECHO))
    assert before is not None and before < 1000
    Job.objects.bulk_create(
        Job(task_path=ECHO, queue_name="emails", args=[], kwargs={}) for _ in range(2000)
    )
    assert jobs.count(task=ECHO) == HISTORY // 100 + 2000


@pytest.mark.django_db
def test_a_count_of_nothing_is_0_without_asking_the_planner():
    """A queryset Django knows is empty (``.none()``, ``pk__in=[]``) runs no
    statement, and its EXPLAIN neither: the count is 0, capped or not."""
    for rows in (Job.objects.none(), Job.objects.filter(pk__in=[])):
        assert counting.bounded_count(rows) == 0
        assert counting.capped_count(rows, 10) == (0, False)
        assert counting.estimated_rows(rows) in (0, None)  # None: SQLite


@pytest.mark.django_db
def test_counts_are_exact_on_sqlite_and_below_the_cap():
    """Without a planner estimate (SQLite) or under the cap, a count is COUNT(*)."""
    Job.objects.bulk_create(
        Job(task_path=ADD, queue_name="default", args=[], kwargs={}) for _ in range(30)
    )
    assert jobs.count() == jobs.count(exact=True) == 30
    assert dead_letters.count() == 0 and workflows.count_runs() == 0


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_stale_statistics_never_make_a_small_count_wrong(settings):
    """A drained backlog leaves statistics that still expect many pending jobs,
    and filters that never go together are estimated as if independent: a
    count under the cap is the rows counted, never the planner's guess, and
    the admin's capped count never says "more than" over an empty page."""
    settings.DISPATCH = {"COUNT_EXACT_MAX": 100}
    Job.objects.bulk_create(
        Job(task_path=ADD, queue_name="default", args=[], kwargs={}) for _ in range(3000)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    Job.objects.update(state="running")  # the transition guard allows no shortcut
    Job.objects.update(state="succeeded", finished_at=timezone.now())
    pending = Job.objects.filter(state="pending")
    assert (counting.estimated_rows(pending) or 0) > 100  # the statistics are stale
    assert jobs.count(state="pending") == 0
    assert jobs.count(queue="default", task=ECHO) == 0
    assert counting.capped_count(pending, 10) == (0, False)


# --- the admin, the console and dispatch_status ------------------------------------------------


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "url",
    [
        "/admin/django_dispatch/job/",
        "/admin/django_dispatch/deadletter/",
    ],
)
def test_the_admin_change_list_reads_its_caps_not_the_history(history, client, login, url):
    """The job list's count stops at COUNT_CAP (+1), its value filters sample the
    newest FILTER_SAMPLE rows, its page is 100: never the whole history."""
    login(superuser=True)
    response, read = reading(lambda: client.get(url))
    assert response.status_code == 200
    assert read["seq scans"] == 0, read
    # One statement reads at most the capped count's rows, or the sample's
    # twice (the newest ids, then their values).
    bound = max(COUNT_CAP + 1, 2 * FILTER_SAMPLE) + 100
    assert 0 < max(read[JOB], read[LETTER]) <= bound, read
    assert bound < HISTORY  # else the caps would not be what bounds it


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "query, matching",
    [
        ("state__exact=cancelled", 0),
        ("queue_name=emails", HISTORY // 100),
        (f"task_path={ECHO}", HISTORY // 100),
        ("state__exact=failed&queue_name=emails", HISTORY // 100),
    ],
    ids=["no-such-state", "rare-queue", "rare-task", "state-and-queue"],
)
def test_the_admin_job_list_of_a_rare_value_reads_its_entries(
    history, client, login, query, matching
):
    """Filtered by a state, queue or task that 1 job in 100 has (or none), in every
    namespace: the finished jobs are read one namespace at a time through the
    ``dispatch_job_list_*`` indexes and the live ones apart, so the page and its count read the
    value's entries (and the live jobs), never the history up to the cap or
    to its end. The filters' sample (the newest rows, whatever the filter) is
    left out: the test above bounds it."""
    login(superuser=True)
    with statements(connection) as seen:
        response = client.get(f"/admin/django_dispatch/job/?{query}")
    assert response.status_code == 200
    cl = response.context["cl"]
    expected = Job.objects.filter(
        **dict(p.split("=") for p in query.replace("__exact", "").split("&"))
    )
    assert cl.result_count == matching
    assert [j.pk for j in cl.result_list] == list(
        expected.order_by("-id").values_list("pk", flat=True)[:100]
    )
    read = rows_read([(sql, params) for sql, params in seen if "DISTINCT" not in sql])
    assert read["seq scans"] == 0, read
    assert read[JOB] <= matching + LIVE + 100, read


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_console_overview_reads_the_window_not_the_history(history, client, login):
    """The overview reads the live jobs and the last hour's finished ones: the
    history is older, so it reads none of it."""
    login(superuser=True)
    response, read = reading(lambda: client.get("/admin/django_dispatch/job/overview/"))
    assert response.status_code == 200
    assert read["seq scans"] == 0 and read[JOB] <= LIVE + 100, read


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_dispatch_status_reads_the_live_jobs_not_the_history(history, settings):
    """``dispatch_status`` counts live jobs through their partial indexes, and dead
    letters up to COUNT_EXACT_MAX (then estimates them)."""
    settings.DISPATCH = {"COUNT_EXACT_MAX": 100}
    status, read = reading(lambda: snapshot(""))
    assert status.dead_letters_unreplayed > 100
    assert read["seq scans"] == 0 and read[JOB] <= LIVE and read[LETTER] <= 101, read


# --- the purge --------------------------------------------------------------------------------


def _delete_sizes(seen) -> list[int]:
    """How many ids each DELETE of the job table named."""
    sizes = []
    for sql, params in seen:
        if re.match(rf'\s*DELETE FROM "{JOB}" ', sql):
            sizes.append(len(params) - 1 if params else 0)  # the ids, and the state
    return sizes


@pytest.mark.django_db(transaction=True)
def test_the_purge_deletes_in_batches_of_purge_batch_each_its_own_transaction(monkeypatch):
    """230 jobs past retention, PURGE_BATCH 50: five DELETEs of at most 50 ids, each
    committed on its own (in no transaction but the one Django's delete opens for
    it), a pause between two."""
    old = timezone_old()
    Job.objects.bulk_create(
        Job(
            task_path=ADD,
            queue_name="default",
            state="succeeded",
            finished_at=old,
            args=[],
            kwargs={},
        )
        for _ in range(230)
    )
    Job.objects.bulk_create(
        Job(task_path=ADD, queue_name="default", args=[], kwargs={}) for _ in range(5)
    )
    pauses: list[float] = []
    monkeypatch.setattr("django_dispatch.store.dead_letters.time.sleep", pauses.append)
    in_transaction = []

    def watch(execute, sql, params, many, context):
        if sql.lstrip().startswith("DELETE"):
            in_transaction.append(len(connection.atomic_blocks))
        return execute(sql, params, many, context)

    with statements(connection) as seen, connection.execute_wrapper(watch):
        deleted, _ = purge_past_retention(
            {"succeeded": 7 * 86400},
            dead_letter_retention=90 * 86400,
            batch=50,
            max_seconds=60,
            pause=0.25,
        )
    assert deleted == 230
    assert _delete_sizes(seen) == [50, 50, 50, 50, 30]
    assert in_transaction and max(in_transaction) <= 1, in_transaction
    # Between batches, not after the last; at least the pause (more: the duty cycle).
    assert len(pauses) == 4 and min(pauses) >= 0.25, pauses
    assert Job.objects.count() == 5  # the live ones stay


@pytest.mark.django_db(transaction=True)
def test_the_purge_pause_comes_from_the_setting_and_the_time_budget_holds(settings, monkeypatch):
    """``PURGE_PAUSE`` is the default pause; a pause that would pass the deadline
    ends the purge instead (the rest is the next purge's)."""
    Job.objects.bulk_create(
        Job(
            task_path=ADD,
            queue_name="default",
            state="succeeded",
            finished_at=timezone_old(),
            args=[],
            kwargs={},
        )
        for _ in range(120)
    )
    settings.DISPATCH = {"PURGE_PAUSE": 0.5}
    pauses: list[float] = []
    monkeypatch.setattr("django_dispatch.store.dead_letters.time.sleep", pauses.append)
    deleted, _ = purge_past_retention(
        {"succeeded": 7 * 86400}, dead_letter_retention=1e9, batch=50, max_seconds=60
    )
    assert deleted == 120 and len(pauses) == 2 and min(pauses) >= 0.5, pauses
    Job.objects.bulk_create(
        Job(
            task_path=ADD,
            queue_name="default",
            state="succeeded",
            finished_at=timezone_old(),
            args=[],
            kwargs={},
        )
        for _ in range(120)
    )
    deleted, _ = purge_past_retention(
        {"succeeded": 7 * 86400}, dead_letter_retention=1e9, batch=50, max_seconds=0.4
    )
    assert deleted == 50  # one batch; the pause would have passed the budget


def test_the_purge_rests_at_least_purge_yield_times_its_batch():
    """The duty cycle: after a batch that took t s the purge rests at least
    ``PURGE_YIELD`` x t (so it runs at most ``1 / (PURGE_YIELD + 1)`` of the
    time, however slow the server), never less than ``PURGE_PAUSE``, and a
    batch slowed by a lock does not stall it beyond ``PURGE_YIELD_MAX``."""
    from django_dispatch.store.dead_letters import PURGE_YIELD, PURGE_YIELD_MAX, purge_rest

    assert PURGE_YIELD >= 1
    assert purge_rest(0.001, 0.05) == 0.05  # a fast batch: the pause
    assert purge_rest(0.1, 0.05) == pytest.approx(PURGE_YIELD * 0.1)  # a slow one: more
    assert purge_rest(0.1, 0.0) == pytest.approx(PURGE_YIELD * 0.1)  # even with no pause
    assert purge_rest(60.0, 0.05) == PURGE_YIELD_MAX
    assert purge_rest(60.0, 5.0) == 5.0  # the pause asked for, if longer


@pytest.mark.django_db(transaction=True)
def test_a_slow_batch_makes_the_purge_rest_longer(monkeypatch):
    """Measured on the real purge: each rest is at least PURGE_YIELD x the batch's time."""
    from django_dispatch.store import dead_letters as module

    Job.objects.bulk_create(
        Job(
            task_path=ADD,
            queue_name="default",
            state="succeeded",
            finished_at=timezone_old(),
            args=[],
            kwargs={},
        )
        for _ in range(150)
    )
    took: list[float] = []
    purge_batch = module.jobs_purge

    def slow_batch(*args, **kwargs):  # the real batch, on a server 50 ms slower
        started = module.time.monotonic()
        module.time.sleep(0.05)
        deleted = purge_batch(*args, **kwargs)
        took.append(module.time.monotonic() - started)
        return deleted

    rests: list[float] = []
    monkeypatch.setattr(module, "jobs_purge", slow_batch)
    real_sleep = module.time.sleep
    monkeypatch.setattr(
        module.time, "sleep", lambda s: real_sleep(s) if s == 0.05 else rests.append(s)
    )
    deleted, _ = purge_past_retention(
        {"succeeded": 7 * 86400}, dead_letter_retention=1e9, batch=50, max_seconds=60, pause=0
    )
    assert deleted == 150
    assert len(rests) == 3  # after each full batch; the fourth found nothing
    for rest, batch in zip(rests, took[:3], strict=True):
        assert rest >= module.PURGE_YIELD * batch


def timezone_old():
    return timezone.now() - timedelta(days=40)


def test_the_knobs_are_validated():
    """``PURGE_PAUSE`` may be 0 (no pause) but not negative; ``COUNT_EXACT_MAX`` is a
    positive whole number. Each problem says what to change."""
    from django.test import override_settings

    from django_dispatch.checks import check_dispatch_settings

    def problems(dispatch):
        with override_settings(DISPATCH=dispatch):
            return [m.msg for m in check_dispatch_settings() if m.id == "django_dispatch.E012"]

    assert problems({"PURGE_PAUSE": 0, "COUNT_EXACT_MAX": 1}) == []
    assert problems({"PURGE_PAUSE": -1}) == ["DISPATCH['PURGE_PAUSE'] must be 0 or more, got -1."]
    assert problems({"COUNT_EXACT_MAX": 0}) == [
        "DISPATCH['COUNT_EXACT_MAX'] must be positive, got 0."
    ]
    assert problems({"COUNT_EXACT_MAX": 10.5}) == [
        "DISPATCH['COUNT_EXACT_MAX'] must be a whole number, got 10.5."
    ]
