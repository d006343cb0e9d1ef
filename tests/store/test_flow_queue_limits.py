"""Queue-level limits (issue #17, items 3, 6 and 7): DISPATCH["QUEUES"] =
{"emails": {"concurrency": N, "rate_limit": "N/unit"}} caps the jobs of every
task in that queue, across workers, through the same gate as the per-task
limits: excess jobs are set aside (blocked, no attempt spent) and promoted
as room frees; limits are read from settings at claim time."""

from __future__ import annotations

import itertools
import time
from collections import Counter

import pytest
from django.conf import settings
from django.core import checks
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from django_dispatch import store
from django_dispatch.compat import InvalidTask
from django_dispatch.core.states import JobState
from django_dispatch.models import ConcurrencyWait, Job, QueueWindow, Worker
from django_dispatch.runtime import flow_cache
from django_dispatch.testing import drain
from tests.conftest import postgres_only, wait_until
from tests.store.helpers import claim_as_worker, most_rows_read, statements
from tests.testapp import flow_tasks, tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

CAPPED = {"capq": {"concurrency": 3}}


def limited(queues):
    """``override_settings`` with ``DISPATCH["QUEUES"] = queues`` (the rest unchanged)."""
    return override_settings(DISPATCH={**settings.DISPATCH, "QUEUES": queues})


@pytest.fixture(autouse=True)
def _fresh_flow_cache():

    flow_cache.forget_paused()


def claim(worker="w", limit=20, queues=()):
    return claim_as_worker(worker, limit, queues)


def finish(claimed):
    for c in claimed:
        assert store.job_finish_if_leased(c.lease, None)


def enqueue(n, queue="capq", task=None, prefix="j"):
    task = task or flow_tasks.mark
    return [int(task.using(queue_name=queue).enqueue(f"{prefix}{i}").id) for i in range(n)]


# --- the claim -------------------------------------------------------------------------


def test_the_cap_spans_the_tasks_of_the_queue_and_the_rest_waits_without_an_attempt():
    with limited(CAPPED):
        a = enqueue(3, task=flow_tasks.mark, prefix="a")
        b = enqueue(3, task=flow_tasks.mark_too, prefix="b")
        free = enqueue(2, queue="other")
        first = claim()
        ids = {c.id for c in first}
        assert ids == {*a, *free}  # claim order: the three oldest of capq, all of "other"
        blocked = Job.objects.filter(pk__in=b)
        assert {(j.state, j.attempts, j.flow_queue) for j in blocked} == {
            (JobState.BLOCKED, 0, "capq")
        }
        wait = ConcurrencyWait.objects.get()
        assert (wait.task_path, wait.concurrency_key, wait.limit) == ("", "capq", 3)
        assert claim() == []
        finish([c for c in first if c.id == a[0]])
        [next_one] = claim()  # promoted into the freed slot, and taken, in one claim
        assert next_one.id == b[0]
        finish([c for c in first if c.id != a[0]] + [next_one])
        assert {c.id for c in claim()} == set(b[1:])
        assert Job.objects.filter(state=JobState.BLOCKED).count() == 0
        assert claim() == []
        assert not ConcurrencyWait.objects.exists()  # forgotten once nothing waits


def test_drain_runs_every_job_of_a_capped_queue():
    with limited({"capq": {"concurrency": 2}}):
        enqueue(7)
        enqueue(3, task=flow_tasks.mark_too, prefix="t")
        assert drain(concurrency=4) == 10
        assert Job.objects.filter(state=JobState.SUCCEEDED).count() == 10
        assert not ConcurrencyWait.objects.exists()


def test_a_rate_limited_queue_counts_starts_per_window():
    with limited({"rateq": {"rate_limit": "3/2s"}}):
        jobs = enqueue(5, queue="rateq")
        wait_until(lambda: time.time() % 2 < 0.2, timeout=3, what="a window boundary")
        first = claim()
        assert len(first) == 3
        finish(first)
        assert claim() == []  # finishing frees no start: the window is full
        assert QueueWindow.objects.get(queue_name="rateq").starts == 3
        waiting = Job.objects.filter(pk__in=jobs, state=JobState.BLOCKED)
        assert waiting.count() == 2 and {j.attempts for j in waiting} == {0}
        wait_until(lambda: (time.time() % 2 < 1.0 and claim()) or None, timeout=4, what="window")
        assert Job.objects.filter(state=JobState.BLOCKED).count() == 0
        assert QueueWindow.objects.get(queue_name="rateq").starts == 2  # a new window


def test_a_rolled_back_claim_counts_no_start():
    with limited({"rateq": {"rate_limit": "5/m"}}):
        enqueue(3, queue="rateq")
        with transaction.atomic():
            assert len(claim()) == 3
            transaction.set_rollback(True)
        assert not QueueWindow.objects.exists()
        assert len(claim()) == 3


def test_changed_limits_apply_to_jobs_already_enqueued():
    """Limits are read at claim time: a raised cap fills at once, a removed one
    lets every set-aside job go; nothing is stranded."""
    with limited({"capq": {"concurrency": 1}}):
        jobs = enqueue(6)
        [first] = claim()
        assert Job.objects.filter(pk__in=jobs, state=JobState.BLOCKED).count() == 5
    with limited({"capq": {"concurrency": 3}}):
        assert len(claim()) == 2  # 3 running now
    with limited({}):
        assert len(claim()) == 3  # no limit: the rest go
        assert not Job.objects.filter(state=JobState.BLOCKED).exists()
        assert claim() == []
        assert not ConcurrencyWait.objects.exists()
    del first


def test_claims_that_do_not_serve_the_queue_promote_it_once():
    """Promoted jobs not yet claimed count against the room: workers serving
    other queues promote a capped queue's jobs into its free slots once, not
    again at every claim (which would only be set aside again)."""
    with limited({"capq": {"concurrency": 2}}):
        jobs = enqueue(6)
        finish(claim(queues=("capq",)))
        assert Job.objects.filter(pk__in=jobs, state=JobState.BLOCKED).count() == 4
        for _ in range(3):
            assert claim(queues=("other",)) == []
        assert Job.objects.filter(pk__in=jobs, state=JobState.PENDING).count() == 2
        assert Job.objects.filter(pk__in=jobs, state=JobState.BLOCKED).count() == 2
        assert {c.id for c in claim(queues=("capq",))} == set(jobs[2:4])  # claim order


def test_set_aside_jobs_of_a_queue_come_back_highest_priority_first():
    """Promotion follows the claim's order (priority, due time, age): an urgent job set
    aside behind a capped queue's older backlog runs at the next free slot."""
    with limited({"capq": {"concurrency": 1}}):
        jobs = enqueue(4)
        [running] = claim()
        assert running.id == jobs[0]
        task = flow_tasks.mark.using(queue_name="capq", priority=10)
        urgent = int(task.enqueue("urgent").id)
        assert claim() == []  # the queue is full: set aside too
        assert Job.objects.get(pk=urgent).state == JobState.BLOCKED
        finish([running])
        [taken] = claim()
        assert taken.id == urgent
        finish([taken])
        assert [c.id for c in claim()] == [jobs[1]]  # then the oldest


@postgres_only
def test_racing_claims_never_exceed_the_queue_cap():
    from tests.concurrency import run_concurrently

    with limited(CAPPED):
        enqueue(15)
        enqueue(15, task=flow_tasks.mark_too, prefix="t")
        for _ in range(5):
            run_concurrently(
                *[lambda n=n: claim(worker=f"w{n}", limit=10) for n in range(8)], together=True
            )
            assert Job.objects.filter(state=JobState.RUNNING).count() <= 3
            for job in Job.objects.filter(state=JobState.RUNNING)[:2]:
                store.job_finish_if_leased(
                    store.Lease(job.pk, job.worker_id, job.lease_epoch), None
                )
        assert Job.objects.filter(state=JobState.SUCCEEDED).count() >= 8


# --- cost when unused ------------------------------------------------------------------


def test_without_queue_limits_the_claim_and_enqueue_are_unchanged():
    from django_dispatch.store.sources.fused_pg import claim_sql

    tasks.add.enqueue(1, 1)
    claim(limit=0)  # fills the flow cache
    with CaptureQueriesContext(connection) as queries:
        assert len(claim()) == 1
    sql = " ".join(q["sql"] for q in queries)
    assert "hashtext" not in sql and QueueWindow._meta.db_table not in sql
    assert "flow_queue" not in sql and ConcurrencyWait._meta.db_table not in sql
    assert "NOT (queue_name = ANY" not in sql  # the lease filter of limited queues
    assert "queue_name = ANY(%(limited)s)" not in claim_sql(queues=False, exclude=False)
    with CaptureQueriesContext(connection) as queries:
        tasks.add.enqueue(2, 2)
    assert len(queries) == 1  # the INSERT alone
    if connection.vendor == "postgresql":  # the raw INSERT's fixed columns (the ORM's: all)
        assert "flow_queue" not in queries[0]["sql"]


def test_with_limits_elsewhere_a_plain_claim_pays_no_gate():
    with limited(CAPPED):
        tasks.add.enqueue(1, 1)
        claim(limit=0)
        with CaptureQueriesContext(connection) as queries:
            assert len(claim()) == 1
        sql = " ".join(q["sql"] for q in queries)
        assert "hashtext" not in sql and QueueWindow._meta.db_table not in sql
        with CaptureQueriesContext(connection) as queries:
            tasks.add.enqueue(2, 2)
        assert len(queries) == 1


@postgres_only
def test_a_claim_reads_no_backlog_of_a_capped_queue():
    """100,000 jobs set aside by a capped queue and 10 runnable elsewhere: no
    statement of the claim reads the backlog (EXPLAIN ANALYZE of each)."""

    with connection.cursor() as cursor:
        table = Job._meta.db_table
        cursor.execute(
            f"""INSERT INTO {table} (namespace, task_path, backend, queue_name, priority, args,
                kwargs, state, run_after, partition_key, idempotency_key, attempts,
                max_attempts, worker_lost_count, lease_epoch, errors, worker_ids, enqueued_at,
                flow_queue, lease_expires_at, worker_id)
            SELECT '', 'tests.testapp.flow_tasks.mark', 'default', 'capq', 0, '[]', '{{}}',
                CASE WHEN i <= 3 THEN 'running' ELSE 'blocked' END, now(), NULL, NULL,
                0, 1, 0, 0, '[]', '[]', now(),
                CASE WHEN i <= 3 THEN NULL ELSE 'capq' END,
                CASE WHEN i <= 3 THEN now() + interval '1 hour' END, 'x'
            FROM generate_series(1, 100000) AS i"""
        )
        cursor.execute(f"ANALYZE {table}")
    ConcurrencyWait.objects.create(task_path="", concurrency_key="capq", limit=3)
    for i in range(10):
        tasks.add.enqueue(i, i)
    with limited(CAPPED):
        with transaction.atomic():
            with statements(connection) as seen:
                claimed = claim(limit=20)
            assert len(claimed) == 10
            transaction.set_rollback(True)
        worst, where = most_rows_read(connection, seen)
    assert worst < 2000, f"a claim statement read {worst} rows: {where}"
    assert Job.objects.filter(state=JobState.BLOCKED).count() == 99997


def test_promoting_a_queue_reads_its_next_jobs_not_its_backlog():
    """A queue's promotion (its counts, then its next jobs in claim order) costs
    the same beside 20,000 set-aside jobs as beside 200
    (``assert_promotion_reads_only_the_next_jobs``). On SQLite it read every job:
    a query reads a partial index there only when it repeats the index's ``IN``
    list (``store.base.state_in``)."""
    from tests.store.test_flow_concurrency import assert_promotion_reads_only_the_next_jobs

    ConcurrencyWait.objects.create(task_path="", concurrency_key="capq", limit=3)
    fields = {"task_path": "tests.testapp.flow_tasks.mark", "queue_name": "capq"}
    assert_promotion_reads_only_the_next_jobs({**fields, "flow_queue": "capq"}, limited(CAPPED))


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda: flow_tasks.capped.using(queue_name="capq"), "a concurrency_limit"),
        (lambda: flow_tasks.rated.using(queue_name="capq"), "a rate_limit"),
        (lambda: flow_tasks.mark.using(queue_name="capq", partition_key="p"), "a partition_key"),
    ],
)
def test_a_job_under_two_gates_is_refused_and_nothing_is_written(make, what):
    refused = pytest.raises(InvalidTask, match=f"has limits in DISPATCH\\['QUEUES'\\].*{what}")
    with limited(CAPPED), refused:
        make().enqueue("x")
    assert not Job.objects.exists()


def run_checks():
    from django_dispatch.checks import check_dispatch_settings, check_queue_limits

    return check_queue_limits() + check_dispatch_settings()


@pytest.mark.parametrize(
    "queues, check_id, words",
    [
        (["emails"], "E060", "must be a dict of queue name -> limits"),
        ({"emails": 5}, "E060", "must be a dict such as"),
        ({"emails": {"concurency": 5}}, "E061", "unknown key 'concurency'. Did you mean"),
        ({"emails": {"rate_limit": "fast"}}, "E062", "does not parse"),
        ({"emails": {"rate_limit": "0/s"}}, "E062", "does not parse"),
        ({"emails": {"concurrency": 0}}, "E063", "at least 1"),
        ({"emails": {"concurrency": 2.5}}, "E063", "whole number"),
        ({"emails": {"concurrency": True}}, "E063", "whole number"),
        ({"emails": {"concurrency": "5"}}, "E063", "whole number"),
    ],
)
def test_bad_queue_limits_are_check_errors(queues, check_id, words):
    with limited(queues):
        messages = [m for m in run_checks() if m.id.startswith("django_dispatch.E06")]
        assert [m.id for m in messages] == [f"django_dispatch.{check_id}"], messages
        assert words in messages[0].msg and "queue-limits" in messages[0].hint
        assert messages[0].level == checks.ERROR
        # a bad entry limits nothing (and the check stops rundispatch): nothing written
        from django_dispatch.conf import queue_limits

        assert queue_limits() == {}
    assert not Job.objects.exists() and not QueueWindow.objects.exists()


def test_a_queue_no_backend_allows_is_a_check_error():
    tasks_setting = {
        "default": {**settings.TASKS["default"], "QUEUES": ["default", "emails"]},
    }
    with override_settings(TASKS=tasks_setting), limited({"emials": {"concurrency": 2}}):
        [message] = [m for m in run_checks() if m.id.startswith("django_dispatch.E06")]
        assert message.id == "django_dispatch.E064"
        assert "'emials', which no DispatchBackend allows" in message.msg
        assert "Did you mean 'emails'?" in message.msg
    with override_settings(TASKS=tasks_setting), limited({"emails": {"concurrency": 2}}):
        assert not [m for m in run_checks() if m.id.startswith("django_dispatch.E06")]


def test_good_limits_pass_the_checks():
    with limited({"emails": {"rate_limit": "10/s", "concurrency": 5}, "idle": {}}):
        assert not [m for m in run_checks() if m.level >= checks.ERROR]


# --- operators -------------------------------------------------------------------------


def test_the_queue_list_shows_limits_and_how_close_the_queue_is(client, django_user_model):
    from io import StringIO

    from django.core.management import call_command
    from django.urls import reverse

    from django_dispatch.flow import queue_overview

    queues = {"capq": {"concurrency": 3}, "rateq": {"rate_limit": "100/h"}, "idle": {}}
    with limited(queues):
        enqueue(5)
        enqueue(2, queue="rateq")
        claim()
        overview = {q.name: q for q in queue_overview()}
        assert (overview["capq"].running, overview["capq"].blocked) == (3, 2)
        assert overview["capq"].limits == {"concurrency": 3}
        assert overview["rateq"].limits == {"rate_limit": "100/h", "starts": 2}
        assert "idle" not in overview  # no limits, no jobs
        out = StringIO()
        call_command("dispatch_queue", "list", stdout=out)
        lines = out.getvalue().splitlines()
        assert "capq: active pending=0 blocked=2 running=3/3" in lines
        assert "rateq: active pending=0 blocked=0 running=2 starts=2 rate_limit=100/h" in lines
        assert not any(line.startswith("at cap:") for line in lines)  # shown with its queue

        user = django_user_model.objects.create_superuser("admin", "a@example.com", "pw")
        client.force_login(user)
        page = client.get(reverse("admin:django_dispatch_pausedqueue_changelist"))
        text = page.content.decode()
        assert "<td>3 / 3</td>" in text and "<td>2 of 100/h</td>" in text


# --- real workers ----------------------------------------------------------------------


def spans(note=None):
    rows = SideEffect.objects.all()
    return [(r.started_at, r.finished_at, r.key) for r in rows if note is None or r.note == note]


def most_at_once(windows) -> int:
    events = sorted([(s, 1) for s, _, _ in windows] + [(e, -1) for _, e, _ in windows])
    return max(itertools.accumulate(step for _, step in events))


def test_three_workers_four_threads_never_run_more_than_the_queue_cap(start_worker):
    """concurrency 3 on "capq", two tasks in it, 3 processes x 4 threads: never
    more than 3 of the queue at once (from the recorded windows); every job
    finishes; the unlimited queue beside it runs more than 3 at once."""
    with limited(CAPPED):
        for i in range(12):
            flow_tasks.mark.using(queue_name="capq").enqueue(f"cap:a{i}", 0.2)
            flow_tasks.mark_too.using(queue_name="capq").enqueue(f"cap:b{i}", 0.2)
        for i in range(24):
            flow_tasks.mark.using(queue_name="free").enqueue(f"free:{i}", 0.2)
    for _ in range(3):
        start_worker("--concurrency", "4", overrides={"POLL_INTERVAL": 0.1, "QUEUES": CAPPED})
    wait_until(
        lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == 48,
        timeout=90,
        what="every job to run",
    )
    windows = spans()
    capped = [w for w in windows if w[2].startswith("cap:")]
    free = [w for w in windows if w[2].startswith("free:")]
    assert len(capped) == 24 and len(free) == 24
    assert {w[2][4] for w in capped} == {"a", "b"}
    assert most_at_once(capped) <= 3, "the queue ran more than its cap at once"
    assert most_at_once(capped) == 3  # and it used its cap
    assert most_at_once(free) > 3  # the queue beside it is not held back
    assert not Job.objects.filter(state=JobState.BLOCKED).exists()
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}


def test_three_workers_hold_a_queue_rate_and_reach_it(start_worker):
    """rate_limit "10/s" on a queue, 3 workers: starts per aligned one-second
    window (Job.started_at, database clock) never exceed 10 (the documented
    burst: at most N per aligned window, 2N in any unaligned stretch), and
    every full second in between sees at least 9 (90%)."""
    queues = {"rateq": {"rate_limit": "10/s"}}
    with limited(queues):
        for i in range(65):
            (flow_tasks.mark if i % 2 else flow_tasks.mark_too).using(queue_name="rateq").enqueue(
                f"r{i}"
            )
    for _ in range(3):
        start_worker("--concurrency", "4", overrides={"POLL_INTERVAL": 0.05, "QUEUES": queues})
    wait_until(
        lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == 65,
        timeout=40,
        what="every rated job to run",
    )
    starts = Counter(int(t.timestamp()) for t in Job.objects.values_list("started_at", flat=True))
    assert max(starts.values()) <= 10, sorted(starts.items())
    seconds = sorted(starts)
    full = seconds[1:-1]  # the first and last windows are partial
    assert len(full) >= 4
    slow = {s: starts[s] for s in full if starts[s] < 9}
    assert not slow, f"windows below 90% of the limit: {slow} of {sorted(starts.items())}"


def test_a_deploy_that_changes_the_limits_strands_nothing(start_worker):
    """Workers with concurrency 1 on "capq" leave a set-aside backlog; after a
    "deploy" (new workers, cap removed) every job runs, more than one at once."""
    import signal

    with limited({"capq": {"concurrency": 1}}):
        for i in range(16):
            flow_tasks.mark.using(queue_name="capq").enqueue(f"cap:{i}", 0.15)
    old = [
        start_worker(
            "--concurrency",
            "4",
            overrides={"POLL_INTERVAL": 0.1, "QUEUES": {"capq": {"concurrency": 1}}},
        )
        for _ in range(2)
    ]
    wait_until(
        lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() >= 2,
        timeout=30,
        what="the capped queue to start",
    )
    assert Job.objects.filter(state=JobState.BLOCKED).exists()
    # Both registered, so both have their stop handlers (installed before they
    # register): one still starting would die of the SIGTERM (exit -15).
    wait_until(lambda: Worker.objects.count() == 2, timeout=30, what="both old workers")
    for worker in old:
        worker.signal(signal.SIGTERM)
    for worker in old:
        assert worker.wait() == 0
    before = {r[2] for r in spans()}
    assert most_at_once(spans()) == 1
    start_worker("--concurrency", "4", overrides={"POLL_INTERVAL": 0.1, "QUEUES": {}})
    wait_until(
        lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == 16,
        timeout=60,
        what="every job to run after the limit was removed",
    )
    after = [w for w in spans() if w[2] not in before]
    assert most_at_once(after) > 1
    assert not Job.objects.filter(state=JobState.BLOCKED).exists()
    assert not ConcurrencyWait.objects.exists()
