"""The store's transitions, called directly: claim, fence, rescue, release."""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from django_dispatch import cancel, enqueue_many, store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job, Leadership, Worker
from django_dispatch.store.base import now_plus
from django_dispatch.store.sources.fused_pg import claim_sql
from tests.conftest import postgres_only
from tests.database_work import assert_flat_beside, database_work
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def claim(worker="w1", limit=10, queues=(), lease=30.0):
    return store.jobs_claim(worker_id=worker, queues=queues, limit=limit, lease_seconds=lease)


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


def test_fence_rejects_writes_from_a_stale_lease():
    result = tasks.add.enqueue(1, 1)
    (first,) = claim(worker="w1", lease=0.01)
    # The lease expires; the rescue returns the job to the queue and w2 takes it.
    Job.objects.filter(pk=result.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    requeued, failed = store.jobs_rescue_expired(max_worker_lost=3)
    assert requeued == [int(result.id)] and failed == []
    (second,) = claim(worker="w2")
    assert second.lease.epoch > first.lease.epoch

    # Every write of the old lease now matches nothing.
    assert not store.job_finish_if_leased(first.lease, "stale")
    assert not store.job_fail_if_leased(first.lease, [], None)
    assert not store.job_progress_if_leased(first.lease, 5, lease_seconds=30)
    assert store.jobs_renew_leases([first.lease], lease_seconds=30) == {int(result.id)}
    assert not store.job_release_if_leased(first.lease, attempts=0, worker_ids=[])
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.RUNNING and job.worker_id == "w2" and job.checkpoint is None

    # The current lease still works, exactly once.
    assert store.job_finish_if_leased(second.lease, 2)
    assert not store.job_finish_if_leased(second.lease, 3)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.return_value == 2
    assert job.worker_ids == ["w1", "w2"] and job.worker_lost_count == 1
    assert [e["exception_class_path"] for e in job.errors] == [
        "django_dispatch.exceptions.WorkerLost"
    ]


def test_same_worker_reclaiming_gets_a_new_epoch():
    """The fence must hold even when the job comes back to the same worker id."""
    tasks.add.enqueue(1, 1)
    (first,) = claim(worker="w1")
    assert store.job_fail_if_leased(first.lease, [], retry_in=0)
    (again,) = claim(worker="w1")
    assert again.lease.epoch != first.lease.epoch
    assert not store.job_finish_if_leased(first.lease, "late")


def test_rescue_fails_a_job_that_keeps_killing_workers():
    result = tasks.add.enqueue(1, 1)
    for n in range(3):
        claim(worker=f"w{n}")
        Job.objects.filter(pk=result.id).update(lease_expires_at=timezone.now() - timedelta(1))
        store.jobs_rescue_expired(max_worker_lost=3)
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.FAILED and job.worker_lost_count == 3
    assert len(job.errors) == 3 and job.finished_at is not None
    assert tasks.add.get_result(result.id).status == "FAILED"


def test_rescue_leaves_live_leases_alone():
    tasks.add.enqueue(1, 1)
    claim(lease=60)
    assert store.jobs_rescue_expired(max_worker_lost=3) == ([], [])


def test_release_gives_the_attempt_back():
    result = tasks.add.enqueue(1, 1)
    (claimed,) = claim()
    assert store.job_release_if_leased(claimed.lease, attempts=0, worker_ids=[])
    job = Job.objects.get(pk=result.id)
    assert job.state == JobState.PENDING and job.attempts == 0 and job.worker_ids == []
    assert job.worker_id is None and job.lease_epoch == claimed.lease.epoch + 1


def test_renew_reports_cancelled_jobs_as_lost():
    a, b = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    leases = [c.lease for c in claim()]
    assert store.jobs_renew_leases(leases, lease_seconds=30) == set()
    assert cancel(b.id)
    assert store.jobs_renew_leases(leases, lease_seconds=30) == {int(b.id)}
    assert Job.objects.get(pk=a.id).state == JobState.RUNNING


def test_cancel_only_live_jobs():
    pending = tasks.add.enqueue(1, 1)
    assert cancel(pending.id) is True
    assert cancel(pending.id) is False  # already cancelled
    assert cancel("12345678") is False and cancel("nope") is False
    assert claim() == []  # a cancelled job is never claimed
    result = tasks.add.get_result(pending.id)
    assert result.status == "FAILED"
    assert result.errors[-1].exception_class_path == "django_dispatch.exceptions.JobCancelled"


def test_retry_now_only_touches_jobs_waiting_for_a_retry():
    later = timezone.now() + timedelta(hours=1)
    deferred = tasks.add.using(run_after=later).enqueue(1, 1)
    retrying = tasks.add.enqueue(2, 2)
    (claimed,) = claim()
    store.job_fail_if_leased(claimed.lease, [], retry_in=3600)
    assert store.jobs_retry_now() == 1
    assert Job.objects.get(pk=deferred.id).run_after == later
    assert [c.id for c in claim()] == [int(retrying.id)]


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
            plan = store.claim_candidates("default", ["default"], 8, priority=0).explain()
        assert "dispatch_job_claim" in plan, plan
        assert "Sort" not in plan or pending == 5, plan
        # The fused statement the worker runs on PostgreSQL: the same scan.
        with connection.cursor() as cursor:
            params = {"window": 8, "lease": 8, "worker_id": "w", "lease_seconds": 30.0}
            cursor.execute(
                "EXPLAIN " + claim_sql(queues=True, exclude=True),
                {**params, "queues": ["default"], "exclude": [1]},
            )
            fused_plan = "\n".join(row[0] for row in cursor.fetchall())
        candidates_plan = fused_plan.split("CTE leased")[0]
        assert "dispatch_job_claim" in candidates_plan, fused_plan
        assert "Seq Scan" not in candidates_plan, fused_plan
        # The claim order rests on the plan's shape (see _CLAIM_SQL): the window's
        # LIMIT pulls from a nested loop over the priorities in the order the
        # recursion yields them, each locking its rows as they are pulled;
        # nothing reorders or buffers rows on the way (a Sort there would lock
        # every priority's window).
        nodes = [
            line.strip().removeprefix("->  ").split("  (")[0]
            for line in candidates_plan.split("CTE candidates")[1].splitlines()
            if line.strip()
        ]
        assert nodes[:2] == ["Limit", "Nested Loop"], nodes
        assert nodes[2].startswith("CTE Scan on priorities"), nodes  # the outer side
        assert nodes[3:6] == ["Subquery Scan on due", "Limit", "LockRows"], nodes
        assert not any(n.split()[0] in {"Sort", "Hash", "Gather", "Materialize"} for n in nodes)


def test_the_leaders_job_sweeps_read_their_indexes_not_the_finished_jobs():
    """The reclaim of expired leases and the stalled-partition safety net run on the
    leader every interval: their database work is the same beside 20,000 finished
    jobs as beside 200 (counted: ``tests.database_work``). As ``state IN (running,
    cancelled)`` the reclaim matched no partial index and read the whole table, on
    both databases; on SQLite, so did the stalled-partition query."""

    def finished(count: int) -> None:
        Job.objects.bulk_create(
            Job(
                task_path="tests.testapp.tasks.add",
                args=[1, 1],
                state=JobState.CANCELLED if i % 3 == 0 else JobState.SUCCEEDED,
                partition_key=f"k{i}" if i % 2 else None,
                finished_at=timezone.now(),
            )
            for i in range(count)
        )
        if connection.vendor == "postgresql":  # SQLite would keep the statistics for later tests
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE django_dispatch_job")

    def sweeps_work() -> int:
        with database_work() as work:
            assert store.jobs_rescue_expired(max_worker_lost=3) == ([], [])
            assert store.partitions_promote_stalled("default") == 0
        return work.amount

    tasks.add.using(partition_key="k1").enqueue(1, 1)
    claim()  # one running job, its lease far from over
    finished(200)
    few = sweeps_work()
    finished(19_800)
    many = sweeps_work()
    # A read of the whole table costs about 100 times as much with 20,000 rows as with 200.
    assert many <= 10 * max(few, 1), f"{few=} {many=}"


def test_claims_read_no_deferred_job():
    """In the claim index each priority's deferred jobs follow its due ones. A claim
    that wants more than is due (every idle poll) or whose due jobs have a lower
    priority than deferred ones read every deferred job of the namespace: a million
    jobs scheduled for next week, on every poll. Claims walk the priorities instead
    (a loose index scan): their work is the same beside 50,000 deferred jobs as
    beside 200 (counted: ``tests.database_work``). So is ``--burst``'s check
    that nothing is due before it exits."""

    def deferred(count: int) -> None:
        later = timezone.now() + timedelta(days=1)
        Job.objects.bulk_create(
            Job(
                task_path="tests.testapp.tasks.add",
                args=[1, 1],
                priority=5 if i % 2 else 0,  # above the due job, and beside it
                run_after=later + timedelta(seconds=i),
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


def test_stale_worker_rows_are_deleted_and_jobs_untouched():
    store.worker_register("old", hostname="h", pid=1, queues=[], concurrency=1)
    store.worker_register("fresh", hostname="h", pid=2, queues=[], concurrency=1)
    Worker.objects.filter(id="old").update(last_seen_at=timezone.now() - timedelta(hours=1))
    result = tasks.add.enqueue(1, 1)
    claim(worker="old")
    assert store.workers_delete_stale(stale_seconds=60) == 1
    assert list(Worker.objects.values_list("id", flat=True)) == ["fresh"]
    assert Job.objects.get(pk=result.id).worker_id == "old"


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


def test_finishing_many_is_fenced_per_row_and_promotes_freed_partitions():
    first = tasks.add.using(partition_key="k").enqueue(1, 1)
    second = tasks.add.using(partition_key="k").enqueue(1, 2)
    plain = tasks.add.enqueue(1, 3)
    stolen = tasks.add.enqueue(1, 4)
    claimed = {c.id: c for c in claim(limit=10)}
    assert Job.objects.get(pk=second.id).state == JobState.BLOCKED
    # Another claim took `stolen` meanwhile: this lease is stale.
    Job.objects.filter(pk=stolen.id).update(lease_epoch=99)
    values = {int(first.id): {"nested": ["ü", 2**40, None]}, int(plain.id): None}
    values[int(stolen.id)] = "lost"
    won = store.jobs_finish_many_if_leased([(claimed[i].lease, v) for i, v in values.items()])
    assert won == {int(first.id), int(plain.id)}
    assert Job.objects.get(pk=stolen.id).state == JobState.RUNNING
    assert Job.objects.get(pk=second.id).state == JobState.PENDING  # promoted
    assert tasks.add.get_result(first.id).return_value == {"nested": ["ü", 2**40, None]}
    assert tasks.add.get_result(plain.id).return_value is None
    # Stored as SQL NULL, as the one-by-one path stores it, not as JSON null.
    assert Job.objects.filter(pk=plain.id, return_value__isnull=True).exists()
    assert [c.id for c in claim(worker="w2")] == [int(second.id)]


def test_now_plus_zero_is_due_in_the_same_instant():
    """``now_plus(0)`` compares equal to ``now()``, in one statement (one clock
    reading on both databases). On SQLite, ``now()`` is text to the
    millisecond and a sum text to the microsecond, compared as text: "now +
    0" sorted after "now", so an artifact given ``expires_in=0`` was not yet
    expired for a sweep in the same millisecond (a flaky CI failure)."""
    Leadership.objects.create(
        name="t", holder="h", expires_at=timezone.now(), acquired_at=timezone.now()
    )
    leases = Leadership.objects.alias(at=now_plus(0))
    assert leases.filter(at__lte=Now()).exists()
    assert leases.filter(at__gte=Now()).exists()
    later = Leadership.objects.alias(at=now_plus(0.5))
    assert not later.filter(at__lte=Now()).exists()
