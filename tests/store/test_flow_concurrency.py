"""Concurrency limits (issue #17, item 2): @task(concurrency_limit=N) with
.using(concurrency_key=...), enforced by the claim across racing workers;
excess jobs are blocked (out of the claim index) and promoted as slots free."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_dispatch import enqueue_many, store
from django_dispatch.compat import InvalidTask
from django_dispatch.core.states import JobState
from django_dispatch.models import ConcurrencyWait, Job
from django_dispatch.runtime import flow_cache
from django_dispatch.testing import drain
from tests.conftest import postgres_only, wait_until
from tests.database_work import assert_flat_beside, database_work
from tests.store.helpers import claim_as_worker, most_rows_read, statements
from tests.testapp import flow_tasks, tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_flow_cache():
    """Each test starts from the database, not from the cache an earlier test left."""

    flow_cache.forget_paused()


def claim(worker="w", limit=10):
    return claim_as_worker(worker, limit)


def finish(claimed):
    for c in claimed:
        assert store.job_finish_if_leased(c.lease, None)


def states(results):
    return Counter(
        Job.objects.filter(pk__in=[r.id for r in results]).values_list("state", flat=True)
    )


# --- options -------------------------------------------------------------------------


def test_the_row_carries_limit_and_key():
    a = flow_tasks.capped.using(concurrency_key="customer:1").enqueue("a")
    b = flow_tasks.capped.enqueue("b")
    plain = tasks.add.enqueue(1, 2)
    rows = {j.pk: j for j in Job.objects.all()}
    assert (rows[int(a.id)].concurrency_key, rows[int(a.id)].concurrency_limit) == ("customer:1", 3)
    assert (rows[int(b.id)].concurrency_key, rows[int(b.id)].concurrency_limit) == ("", 3)
    assert (rows[int(plain.id)].concurrency_key, rows[int(plain.id)].concurrency_limit) == (
        None,
        None,
    )
    [many] = enqueue_many(
        flow_tasks.capped.using(concurrency_key="k"), [(("m",), {})], return_results=True
    )
    assert Job.objects.get(pk=many.id).concurrency_key == "k"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: tasks.add.using(concurrency_key="k"), "needs @task\\(concurrency_limit"),
        (lambda: flow_tasks.capped.using(partition_key="p"), "both a partition_key"),
        (lambda: flow_tasks.capped.using(concurrency_key=""), "non-empty string"),
    ],
)
def test_bad_options_are_refused_and_nothing_is_written(make, message):
    with pytest.raises(InvalidTask, match=message):
        make().enqueue("x")
    assert not Job.objects.exists()


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "3"])
def test_a_bad_limit_is_refused_at_definition(limit):
    from django_dispatch import task

    with pytest.raises((InvalidTask, TypeError), match="concurrency_limit"):
        task(concurrency_limit=limit)(tasks.add.func)


# --- the claim -------------------------------------------------------------------------


def test_the_claim_admits_up_to_the_cap_per_key_and_blocks_the_rest():
    a = [flow_tasks.capped.using(concurrency_key="A").enqueue(f"a{i}") for i in range(5)]
    b = [flow_tasks.capped.using(concurrency_key="B").enqueue(f"b{i}") for i in range(2)]
    free = tasks.add.enqueue(1, 1)
    first = claim(limit=20)
    assert {c.id for c in first} == {
        *(int(r.id) for r in a[:3]),
        *(int(r.id) for r in b),
        int(free.id),
    }
    assert states(a) == {JobState.RUNNING: 3, JobState.BLOCKED: 2}  # out of the claim index
    assert ConcurrencyWait.objects.filter(concurrency_key="A").count() == 1
    assert claim() == []
    finish([c for c in first if c.id == int(a[0].id)])
    [next_one] = claim()  # the claim promotes into the freed slot, and takes it
    assert next_one.id == int(a[3].id)
    assert states(a) == {JobState.RUNNING: 3, JobState.SUCCEEDED: 1, JobState.BLOCKED: 1}
    finish([c for c in first if c.id in {int(r.id) for r in a[1:3]}] + [next_one])
    [last] = claim()
    assert last.id == int(a[4].id)
    finish([last])
    assert claim() == []
    assert not ConcurrencyWait.objects.exists()  # forgotten once nothing of it waits


def test_a_deferred_job_of_the_group_holds_no_slot():
    """Review finding (wave 5): promotion counted every pending job of the group,
    so one deferred to tomorrow (or backing off before a retry) kept a freed
    slot empty and the group's blocked jobs waited until it ran."""
    from django_dispatch.store.gates import promotion as flow

    group = flow_tasks.capped.using(concurrency_key="customer:42")
    tomorrow = timezone.now() + timedelta(days=1)
    deferred = group.using(run_after=tomorrow).enqueue("d")
    running = [group.enqueue(f"a{i}") for i in range(3)]
    waiting = group.enqueue("b")
    first = claim()
    assert {c.id for c in first} == {int(r.id) for r in running}
    assert states([waiting]) == {JobState.BLOCKED: 1}
    finish(first[:1])
    db = store.db_alias()
    assert flow.concurrency_promote(db, "") == 1  # the freed slot is filled ...
    # ... once: the promoted job, pending and due, holds the slot until claimed
    assert flow.concurrency_promote(db, "") == 0
    [taken] = claim()
    assert taken.id == int(waiting.id)
    assert states([deferred]) == {JobState.SCHEDULED: 1}  # still waiting for tomorrow


def test_set_aside_jobs_come_back_highest_priority_first():
    """The claim runs higher priorities first; promotion kept only the age, so a
    job enqueued with priority 10 behind a full group waited for the group's whole
    older backlog of priority 0 (a note since stop 22). Now set-aside jobs come
    back in claim order: priority, then due time, then age."""
    group = flow_tasks.capped.using(concurrency_key="tenant")
    running = [group.enqueue(f"r{i}") for i in range(3)]
    backlog = [group.enqueue(f"b{i}") for i in range(4)]
    first = claim()
    assert {c.id for c in first} == {int(r.id) for r in running}
    urgent = group.using(priority=10).enqueue("urgent")
    later = group.using(priority=5).enqueue("later")
    assert claim() == []  # the group is full: both are set aside too
    assert states([urgent, later]) == {JobState.BLOCKED: 2}
    finish(first[:1])
    assert [c.id for c in claim()] == [int(urgent.id)]
    finish(first[1:3])
    assert {c.id for c in claim()} == {int(later.id), int(backlog[0].id)}


def test_promotion_reads_the_next_jobs_not_the_backlog():
    """The promotion's order (the claim's) comes from ``dispatch_job_conc_next``
    (0015), and reading it costs the same beside 20,000 blocked jobs as beside
    200 (``assert_promotion_reads_only_the_next_jobs``), where a sort would read
    the whole backlog. Before, PostgreSQL's UPDATE scanned the job table, and on
    SQLite every query of the promotion did."""
    path = "tests.testapp.flow_tasks.capped"
    ConcurrencyWait.objects.create(task_path=path, concurrency_key="tenant", limit=3)
    assert_promotion_reads_only_the_next_jobs(
        {"task_path": path, "concurrency_key": "tenant", "concurrency_limit": 3}
    )


def assert_promotion_reads_only_the_next_jobs(
    fields: dict, limits: AbstractContextManager | None = None
) -> None:
    """Promoting 3 set-aside jobs (``fields`` make them those of one waiting group
    or queue, ``limits`` its settings) picks the claim's next 3 and costs the same
    beside 20,000 set-aside jobs of mixed priorities, and as many finished ones,
    as beside 200, on both databases (counted: ``tests.database_work``). Every
    finished job is stored before every set-aside one, so a scan of the table
    meets all of them before it finds one to promote."""
    from django_dispatch.store.gates import promotion as flow

    added = 0

    def set_aside(count: int) -> None:
        nonlocal added
        added += count
        Job.objects.filter(state=JobState.BLOCKED).delete()
        for state in (JobState.SUCCEEDED, JobState.BLOCKED):
            Job.objects.bulk_create(
                Job(
                    args=["x"],
                    priority=i % 7,
                    state=state,
                    finished_at=timezone.now() if state == JobState.SUCCEEDED else None,
                    **fields,
                )
                for i in range(count if state == JobState.SUCCEEDED else added)
            )
        if connection.vendor == "postgresql":  # its plans follow the statistics
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE django_dispatch_job")

    def promotion_work() -> int:
        with limits or nullcontext(), transaction.atomic():
            expected = list(
                Job.objects.filter(state=JobState.BLOCKED)
                .order_by("-priority", "run_after", "id")  # the claim's order
                .values_list("id", flat=True)[:3]
            )
            with database_work() as work:
                assert flow.concurrency_promote(store.db_alias(), "") == 3
            promoted = Job.objects.filter(state=JobState.PENDING).values_list("id", flat=True)
            assert sorted(promoted) == sorted(expected)  # three of priority 6, the oldest
            transaction.set_rollback(True)
        return work.amount

    assert_flat_beside(set_aside, promotion_work, few=200, many=20_000)


def test_the_task_wide_cap_without_a_key():
    jobs = [flow_tasks.capped_two.enqueue(f"x{i}") for i in range(5)]
    assert len(claim()) == 2
    assert states(jobs)[JobState.BLOCKED] == 3


def test_a_plain_claim_makes_no_gate_and_no_query_on_limits():
    from django.test.utils import CaptureQueriesContext

    tasks.add.enqueue(1, 1)
    claim(limit=0)  # fills the flow cache
    with CaptureQueriesContext(connection) as queries:
        assert len(claim()) == 1
    sql = " ".join(q["sql"] for q in queries)
    assert ConcurrencyWait._meta.db_table not in sql
    assert "hashtext" not in sql


def test_drain_runs_every_limited_job():
    for key, i in itertools.product("ABC", range(4)):
        flow_tasks.capped.using(concurrency_key=key).enqueue(f"{key}{i}")
    assert drain(concurrency=4) == 12
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == 12
    assert not ConcurrencyWait.objects.exists()


@postgres_only
def test_racing_claims_never_exceed_the_cap():
    """Eight claimers at once, each wanting everything: the group lock lets one
    count and admit at a time, so at most 3 of the key ever run."""
    from tests.concurrency import run_concurrently

    for i in range(30):
        flow_tasks.capped.using(concurrency_key="hot").enqueue(f"h{i}")
    for _ in range(5):
        run_concurrently(
            *[lambda n=n: claim(worker=f"w{n}", limit=10) for n in range(8)], together=True
        )
        assert Job.objects.filter(state=JobState.RUNNING).count() <= 3
        for job in Job.objects.filter(state=JobState.RUNNING)[:2]:
            store.job_finish_if_leased(store.Lease(job.pk, job.worker_id, job.lease_epoch), None)
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() >= 8


@postgres_only
def test_a_claim_reads_no_capped_backlog():
    """100,000 jobs blocked behind capped keys and 10 runnable elsewhere: the
    claim's statements read the runnable ones and the waiting groups, never
    the blocked backlog (EXPLAIN ANALYZE of each statement)."""
    groups = 100
    with connection.cursor() as cursor:
        table = Job._meta.db_table
        cursor.execute(
            f"""INSERT INTO {table} (namespace, task_path, backend, queue_name, priority, args,
                kwargs, state, run_after, partition_key, idempotency_key, attempts,
                max_attempts, worker_lost_count, lease_epoch, errors, worker_ids, enqueued_at,
                concurrency_key, concurrency_limit)
            SELECT '', 'tests.testapp.flow_tasks.capped', 'default', 'default', 0, '[]', '{{}}',
                CASE WHEN i <= %s * 3 THEN 'running' ELSE 'blocked' END, now(), NULL, NULL,
                0, 1, 0, 0, '[]', '[]', now(), 'k' || (i %% %s), 3
            FROM generate_series(1, 100000) AS i""",
            [groups, groups],
        )
        cursor.execute(f"ANALYZE {table}")
    ConcurrencyWait.objects.bulk_create(
        ConcurrencyWait(
            task_path="tests.testapp.flow_tasks.capped", concurrency_key=f"k{g}", limit=3
        )
        for g in range(groups)
    )
    for i in range(10):
        tasks.add.enqueue(i, i)
    with transaction.atomic():
        with statements(connection) as seen:
            claimed = claim(limit=20)
        assert len(claimed) == 10
        transaction.set_rollback(True)
    worst, _ = most_rows_read(connection, seen)
    assert worst < 2000, f"a claim statement read {worst} rows"


# --- real workers ----------------------------------------------------------------------


def test_three_workers_four_threads_never_run_more_than_the_cap_per_key(start_worker):
    keys = [f"k{n}" for n in range(5)]
    for key, i in itertools.product(keys, range(8)):
        flow_tasks.capped.using(concurrency_key=key).enqueue(f"{key}:{i}", 0.15)
    for _ in range(3):
        start_worker("--concurrency", "4", overrides={"POLL_INTERVAL": 0.1})
    wait_until(
        lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == 40,
        timeout=60,
        what="every limited job to run",
    )
    windows = defaultdict(list)
    for row in SideEffect.objects.all():
        windows[row.key.split(":")[0]].append((row.started_at, row.finished_at))
    assert sorted(windows) == keys and all(len(w) == 8 for w in windows.values())
    for key, spans in windows.items():
        # the most running at once: sweep over start (+1) and end (-1) events
        events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
        most = max(itertools.accumulate(step for _, step in events))
        assert most <= 3, f"{most} jobs of {key} ran at once"
    overall = sorted(
        [(s, 1) for w in windows.values() for s, _ in w]
        + [(e, -1) for w in windows.values() for _, e in w]
    )
    assert max(itertools.accumulate(step for _, step in overall)) > 3  # the cap is per key
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == 40
    assert not Job.objects.filter(state=JobState.BLOCKED).exists()


def test_groups_at_cap_are_listed_for_operators():
    from io import StringIO

    from django.core.management import call_command

    from django_dispatch.flow import groups_at_cap

    for i in range(5):
        flow_tasks.capped.using(concurrency_key="A").enqueue(f"a{i}")
    claim()
    [group] = groups_at_cap()
    assert (group.concurrency_key, group.limit, group.running, group.blocked) == ("A", 3, 3, 2)
    assert group.rate is None and group.starts is None
    out = StringIO()
    call_command("dispatch_queue", "list", stdout=out)
    assert "at cap: tests.testapp.flow_tasks.capped [A] running=3/3 waiting=2" in out.getvalue()
