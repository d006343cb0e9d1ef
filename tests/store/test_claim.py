"""The claim (store/claim.py, its sources and gates, store/leasing.py), called directly:
order, limits, the lease it sets, the plans it reads."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dispatch import enqueue_many, store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.store.sources.fused_pg import claim_sql
from tests.conftest import postgres_only
from tests.database_work import assert_flat_beside, database_work
from tests.store.helpers import claim
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_claim_order_is_priority_then_run_after_then_id():
    low = tasks.add.using(priority=-5).enqueue(1, 1)
    first = tasks.add.enqueue(1, 2)
    second = tasks.add.enqueue(1, 3)
    high = tasks.add.using(priority=50).enqueue(1, 4)
    assert [c.id for c in claim()] == [int(high.id), int(first.id), int(second.id), int(low.id)]


def test_claim_respects_limit_queues_and_run_after():
    tasks.add.enqueue(1, 1)
    email = tasks.echo.enqueue("x")  # queue "emails"
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    assert [c.id for c in claim(queues=["emails"])] == [int(email.id)]
    assert len(claim(limit=5)) == 1  # the deferred job is not runnable yet
    assert claim() == []


def test_claim_sets_lease_and_records_attempt():
    result = tasks.add.enqueue(1, 1)
    (claimed,) = claim(worker="w1")
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.RUNNING and job.worker_id == "w1"
    assert job.lease_epoch == claimed.lease.epoch == 1
    assert job.attempts == 1 and job.worker_ids == ["w1"]
    assert job.lease_expires_at > job.started_at
    assert claimed.row["worker_ids"] == ["w1"] and claimed.row["attempts"] == 1


def test_claimed_rows_never_share_their_json_values():
    """Empty arguments and errors are built without the JSON parser (on
    PostgreSQL): each row must still get objects of its own to change."""
    tasks.echo.enqueue({"deep": [1]})  # priority 5: claimed first
    tasks.noop.enqueue()
    tasks.noop.enqueue()
    third, first, second = claim()
    assert first.row["args"] == [] and first.row["kwargs"] == {} and first.row["errors"] == []
    first.row["args"].append("mine")
    first.row["kwargs"]["k"] = 1
    first.row["errors"].append({})
    assert second.row["args"] == [] and second.row["kwargs"] == {} and second.row["errors"] == []
    assert third.row["args"] == [{"deep": [1]}]


def test_two_claimers_never_share_a_job():
    for i in range(20):
        tasks.add.enqueue(i, i)
    a = {c.id for c in claim(worker="a", limit=15)}
    b = {c.id for c in claim(worker="b", limit=15)}
    assert len(a) == 15 and len(b) == 5 and not a & b


@postgres_only
def test_claim_query_uses_the_partial_index_among_many_finished_rows():
    from django.db import connection, transaction

    Job.objects.bulk_create(
        Job(task_path="tests.testapp.tasks.add", args=[1, 1], state=JobState.SUCCEEDED)
        for _ in range(20000)
    )
    for pending in (5, 5000):
        enqueue_many(tasks.add, [((i, i), {}) for i in range(pending)])
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE django_dispatch_job")
        with transaction.atomic():
            plan = store.claim_candidates("default", ["default"], 8).explain()
        assert "dispatch_job_claim" in plan, plan
        assert "Sort" not in plan or pending == 5, plan
        # The fused statement the worker runs on PostgreSQL: the same scan.
        fused_plan = _explain_fused()
        candidates_plan = fused_plan.split("CTE leased")[0]
        assert "dispatch_job_claim" in candidates_plan, fused_plan
        assert "Seq Scan" not in candidates_plan, fused_plan
        _assert_one_ordered_scan(candidates_plan)


def _explain_fused(analyze: bool = False) -> str:
    """The plan of the fused claim statement (``_CLAIM_SQL``), for 8 jobs."""
    from django.db import transaction

    params = {"window": 8, "lease": 8, "worker_id": "w", "lease_seconds": 30.0}
    explain = "EXPLAIN (ANALYZE, BUFFERS) " if analyze else "EXPLAIN "
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            explain + claim_sql(queues=True, exclude=True),
            {**params, "queues": ["default"], "exclude": [1]},
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)  # EXPLAIN ANALYZE leased them: undo
    return plan


def _assert_one_ordered_scan(candidates_plan: str) -> None:
    """The claim order rests on the plan's shape (see _CLAIM_SQL): the window's
    LIMIT pulls from one scan of the claim index in its order, locking rows as
    they are pulled; nothing reorders or buffers rows on the way (a Sort
    there would lock every due job), and no walk over the priorities."""
    nodes = [
        line.strip().removeprefix("->  ").split("  (")[0]
        for line in candidates_plan.split("CTE candidates")[1].splitlines()
        if line.strip() and not line.strip().startswith(("Index Cond", "Filter", "Buffers"))
    ]
    assert nodes[:2] == ["Limit", "LockRows"], nodes
    assert nodes[2].startswith("Index Scan using dispatch_job_claim on"), nodes
    assert not any(n.split()[0] in {"Sort", "Hash", "Gather", "Materialize"} for n in nodes)
    assert "priorities" not in candidates_plan and "Nested Loop" not in candidates_plan


@postgres_only
def test_the_claim_reads_only_pending_rows_beside_many_scheduled_ones():
    """Deferred jobs wait as ``scheduled``, outside the claim index: with 20,000 of
    them, of every priority, the claim's scan reads its window of due jobs and
    nothing else, in one ordered scan of the pending rows."""
    later = timezone.now() + timedelta(days=1)
    for priority in (9, 0, -9):
        enqueue_many(
            tasks.add.using(priority=priority, run_after=later),
            [((i, i), {}) for i in range(8000 if priority else 4000)],
        )
    assert Job.objects.filter(state=JobState.SCHEDULED).count() == 20_000
    due = [tasks.add.using(priority=-5).enqueue(1, i) for i in range(3)]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_dispatch_job")
    plan = _explain_fused(analyze=True)
    candidates_plan = plan.split("CTE leased")[0]
    _assert_one_ordered_scan(candidates_plan)
    scan = next(line for line in candidates_plan.splitlines() if "Index Scan" in line)
    assert "rows=3 " in scan, plan  # the three due jobs, no scheduled row
    assert [c.id for c in claim(limit=8)] == [int(r.id) for r in due]


def test_claims_read_no_deferred_job():
    """Were deferred jobs in the claim index, a claim that wants more than is due
    (every idle poll) or whose due jobs have a lower priority than deferred ones
    would read every deferred job of the namespace: a million jobs scheduled for
    next week, on every poll. They wait as ``scheduled`` instead, and the stager
    reads only the due ones: a claim's work, staging included, is the same
    beside 50,000 deferred jobs as beside 200 (counted: ``tests.database_work``).
    So is ``--burst``'s check that nothing is due before it exits."""

    def deferred(count: int) -> None:
        later = timezone.now() + timedelta(days=1)
        Job.objects.bulk_create(
            Job(
                task_path="tests.testapp.tasks.add",
                args=[1, 1],
                priority=5 if i % 2 else 0,  # above the due job, and beside it
                run_after=later + timedelta(seconds=i),
                state=JobState.SCHEDULED,  # as every enqueue of a deferred job writes it
            )
            for i in range(count)
        )
        if connection.vendor == "postgresql":  # SQLite would keep the statistics for later tests
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE django_dispatch_job")

    def claims_work() -> int:
        claim(limit=8)  # plans and catalog reads made once, outside the count
        due = tasks.add.using(priority=-1).enqueue(1, 1)
        with database_work() as work:
            assert [c.id for c in claim(limit=8)] == [int(due.id)]
            assert claim(limit=8) == []  # an idle poll
            assert not store.jobs_due_exist(queues=())  # rundispatch --burst's last question
        return work.amount

    assert_flat_beside(deferred, claims_work, few=200, many=50_000)


def test_one_claim_takes_heads_and_unkeyed_jobs_in_claim_order():
    """The fused claim (PostgreSQL) and the ORM claim (SQLite) agree."""
    head = tasks.add.using(partition_key="k").enqueue(1, 1)
    free1 = tasks.add.enqueue(1, 2)
    behind = tasks.add.using(partition_key="k").enqueue(1, 3)
    free2 = tasks.add.enqueue(1, 4)
    urgent = tasks.add.using(priority=9).enqueue(1, 5)
    claimed = claim(limit=4)
    assert [c.id for c in claimed] == [int(x.id) for x in (urgent, head, free1, free2)]
    assert all(c.row["attempts"] == 1 and c.lease.epoch == 1 for c in claimed)
    assert Job.objects.get(pk=behind.id).state == JobState.BLOCKED
    leased = Job.objects.filter(state=JobState.RUNNING, worker_id="w1", attempts=1)
    assert leased.count() == 4


def test_a_claim_never_leases_more_than_its_limit():
    for i in range(6):
        tasks.add.enqueue(i, i)
    tasks.add.using(partition_key="k").enqueue(0, 0)
    tasks.add.using(partition_key="k").enqueue(0, 1)
    assert len(claim(limit=3)) == 3
    assert Job.objects.filter(state=JobState.RUNNING).count() == 3
    assert len(claim(limit=10)) == 4  # three unkeyed, the head of "k"
    assert Job.objects.filter(state=JobState.PENDING).count() == 0
