"""Resource needs, capacity and locality (#16): what a worker may claim.

Store-level tests call the claim with a ``Placement`` (what a worker with
``--capacity``/``--locality`` passes); process tests start real workers.
"""

import itertools
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.utils import timezone

from django_dispatch import enqueue_many, store
from django_dispatch.compat import InvalidTask
from django_dispatch.core.resources import check_capacity, parse_capacity, shape_of
from django_dispatch.core.states import JobState
from django_dispatch.models import Job, JobUsage
from django_dispatch.store.types import Placement
from django_dispatch.testing import drain
from tests.conftest import wait_until
from tests.database_work import assert_flat_beside, database_work
from tests.store.helpers import statements
from tests.testapp import resource_tasks as rt
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)
POSTGRES = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL plans and row versions"
)


def claim(placement=None, limit=1, worker_id="w"):
    return store.jobs_claim(
        worker_id=worker_id, queues=(), limit=limit, lease_seconds=30, placement=placement
    )


def mem(mb, **more):
    return Placement(capacity={"memory_mb": mb, **more})


# --- bad input: clear errors, nothing written ------------------------------------


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"memory_mb": -1}, "non-negative whole number"),
        ({"memory_mb": 1.5}, "non-negative whole number"),
        ({"gpu": True}, "non-negative whole number"),
        ({"memory mb": 1}, "not valid"),
        ([("memory_mb", 1)], "must be a dict"),
        ("lots", "must be a dict"),
    ],
)
def test_bad_resources_are_refused_and_nothing_is_written(bad, says):
    with pytest.raises(InvalidTask, match=says):
        tasks.add.using(resources=bad).enqueue(1, 2)
    with pytest.raises(InvalidTask, match=says):
        from django_dispatch import task

        task(resources=bad)(tasks.add.func)
    assert not Job.objects.exists()


def test_bad_locality_is_refused():
    with pytest.raises(InvalidTask, match="locality must be"):
        tasks.add.using(locality="x" * 101).enqueue(1, 2)
    assert not Job.objects.exists()


@pytest.mark.parametrize("text", ["memory_mb", "memory_mb=-1", "memory_mb=1.5", "=3", "a b=1"])
def test_bad_capacity_syntax(text):
    with pytest.raises(ValueError, match="NAME=WHOLE_NUMBER"):
        parse_capacity(text)
    with pytest.raises(CommandError, match="NAME=WHOLE_NUMBER"):
        call_command("rundispatch", "--burst", "--capacity", text)


def test_capacity_setting_is_validated(settings):
    assert check_capacity({"memory_mb": 10}) == {"memory_mb": 10}
    assert check_capacity("memory_mb=8192, gpu=1") == {"memory_mb": 8192, "gpu": 1}
    settings.DISPATCH = {"CAPACITY": {"memory_mb": -5}}
    from django_dispatch.conf import get_settings

    assert any("CAPACITY" in p for p in get_settings().validate())


def test_needs_and_locality_are_stored_with_the_job():
    job = rt.big.using(locality="eu").enqueue("k")
    row = Job.objects.get(pk=job.id)
    assert row.resources == {"memory_mb": 600} and row.locality == "eu"
    assert row.resource_shape == shape_of({"memory_mb": 600})
    zero = tasks.add.using(resources={"gpu": 0}).enqueue(1, 2)  # a need of 0 is none
    assert Job.objects.get(pk=zero.id).resource_shape is None
    many = enqueue_many(rt.big, [(("a",), {}), (("b",), {})], return_results=True)
    stored = Job.objects.filter(id__in=[r.id for r in many]).values_list("resources", flat=True)
    assert list(stored) == [{"memory_mb": 600}] * 2
    assert Job.objects.filter(resource_shape=row.resource_shape).count() == 3


# --- the claim -------------------------------------------------------------------


def test_a_worker_without_capacity_runs_only_jobs_without_needs():
    rt.big.enqueue("big")
    small = tasks.add.enqueue(1, 2)
    assert [c.id for c in claim(limit=5)] == [int(small.id)]
    assert not claim(limit=5)
    assert not store.jobs_due_exist(queues=())  # --burst exits: nothing it could run


def test_a_job_without_needs_runs_on_a_worker_with_capacity():
    small = tasks.add.enqueue(1, 2)
    assert [c.id for c in claim(mem(100))] == [int(small.id)]


def test_the_limit_cuts_after_the_order_and_no_unfit_job_is_written():
    """10,000 pending jobs that do not fit, ahead in priority and age; one
    that does, behind them: a worker with one slot gets it, the others stay
    exactly as they were."""
    huge = rt.big.using(resources={"memory_mb": 4000}, priority=10)
    enqueue_many(huge, [((f"h{i}",), {}) for i in range(10_000)])
    fitting = rt.big.using(resources={"memory_mb": 100}, priority=-5).enqueue("fits")
    before = _versions()
    (claimed,) = claim(mem(1000), limit=1)
    assert claimed.id == int(fitting.id)
    after = _versions()
    del before[claimed.id], after[claimed.id]
    assert before == after  # no other row was written (PostgreSQL: its xmin too)
    pending = Job.objects.filter(state=JobState.PENDING)
    assert pending.count() == 10_000 and not pending.exclude(lease_epoch=0).exists()


def _versions():
    """Each job's row version: (lease_epoch, state, worker_id) and PostgreSQL's xmin."""
    rows = Job.objects.values_list("id", "lease_epoch", "state", "worker_id")
    versions = {i: rest for i, *rest in rows}
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id, xmin::text FROM {Job._meta.db_table}")
            for job_id, xmin in cursor.fetchall():
                versions[job_id] = (*versions[job_id], xmin)
    return versions


def test_jobs_claimed_together_fit_together():
    for i in range(3):
        rt.big.enqueue(f"b{i}")
    small = [tasks.add.enqueue(i, i) for i in range(2)]
    taken = claim(mem(1000), limit=5)
    needs = [c.row["resources"] for c in taken]
    assert needs.count({"memory_mb": 600}) == 1
    assert {c.id for c in taken} >= {int(s.id) for s in small}
    # What it holds counts: a worker holding 600 of 1000 takes no other 600.
    held = Placement(capacity={"memory_mb": 1000}, held={"memory_mb": 600})
    assert not claim(held, limit=5)


def test_a_gpu_job_needs_a_gpu():
    rt.on_gpu.enqueue("g")
    assert not claim(mem(64_000), limit=3)
    (claimed,) = claim(Placement(capacity={"gpu": 1}), limit=3)
    assert claimed.row["resources"] == {"gpu": 1}


def test_locality_first_among_equal_priorities_never_above_priority():
    far = tasks.add.enqueue(1, 1)
    near = tasks.add.using(locality="eu").enqueue(2, 2)
    urgent = tasks.add.using(priority=5).enqueue(3, 3)
    order = [c.id for c in claim(Placement(locality="eu"), limit=1)]
    assert order == [int(urgent.id)]
    assert [c.id for c in claim(Placement(locality="eu"), limit=1)] == [int(near.id)]
    assert [c.id for c in claim(Placement(locality="us"), limit=1)] == [int(far.id)]


def test_locality_is_preferred_not_required():
    eu = tasks.add.using(locality="eu").enqueue(1, 1)
    assert [c.id for c in claim(Placement(locality="us"))] == [int(eu.id)]
    other = tasks.add.using(locality="eu").enqueue(1, 1)
    assert [c.id for c in claim()] == [int(other.id)]  # no locality at all: also fine


def test_starvation_policy_holds_back_until_the_big_job_fits():
    big = rt.big.using(resources={"memory_mb": 900}).enqueue("big")
    Job.objects.filter(pk=big.id).update(
        run_after=Job.objects.get(pk=big.id).run_after.replace(year=2000)
    )
    small = tasks.add.enqueue(1, 1)
    busy = Placement(capacity={"memory_mb": 1000}, held={"memory_mb": 200}, starvation_seconds=60)
    assert not claim(busy, limit=3)  # it waits past the threshold: nothing else is taken
    room = Placement(capacity={"memory_mb": 1000}, starvation_seconds=60)
    # then it first, with what fits beside it
    assert [c.id for c in claim(room, limit=3)] == [int(big.id), int(small.id)]


def test_a_backlog_older_than_the_threshold_is_still_claimed_a_window_at_a_time():
    """Every job of a backlog older than the threshold is "starved"; the claim
    must still take a full window (the oldest first), not one job at a time."""
    old = Job.objects.get(pk=rt.big.using(resources={"memory_mb": 10}).enqueue("0").id).run_after
    ids = [int(rt.big.using(resources={"memory_mb": 10}).enqueue(str(i)).id) for i in range(6)]
    Job.objects.filter(pk__in=ids).update(run_after=old.replace(year=2000))
    room = Placement(capacity={"memory_mb": 1000}, starvation_seconds=60)
    claimed = [c.id for c in claim(room, limit=4)]
    assert len(claimed) == 4 and claimed[0] == ids[0]


@POSTGRES
def test_the_claim_reads_no_unfit_job_in_a_big_backlog():
    """100,000 pending jobs too big for this worker: no step of its claim
    reads more than a handful of rows, through the indexes."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO {Job._meta.db_table} (namespace, task_path, backend, queue_name,
            priority, args, kwargs, state, attempts, max_attempts, worker_lost_count,
            lease_epoch, errors, worker_ids, resources, resource_shape)
            SELECT '', 'tests.testapp.resource_tasks.big', 'default', 'default', 5,
            '[]', '{{}}', 'pending', 0, 1, 0, 0, '[]', '[]', %s::jsonb, %s
            FROM generate_series(1, 100000)""",
            ['{"memory_mb": 5000}', shape_of({"memory_mb": 5000})],
        )
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    small = rt.big.using(resources={"memory_mb": 10}).enqueue("small")
    plain = tasks.add.enqueue(1, 1)
    for placement in (mem(1000), mem(1000, gpu=1), None):
        with statements(connection) as seen:
            taken = claim(placement, limit=2)
        assert {c.id for c in taken} <= {int(small.id), int(plain.id)} and taken
        for sql, params in seen:
            if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                plan = cursor.fetchone()[0]
            assert _most_rows(plan[0]["Plan"]) < 100, sql
        for job in taken:
            store.job_release_if_leased(job.lease, attempts=0, worker_ids=[])


@POSTGRES
def test_the_pick_takes_priorities_in_the_order_the_walk_yields_them():
    """``_PICK_SQL`` (as ``_CLAIM_SQL``) cuts its window with a LIMIT over a nested
    loop whose outer side is the walk of the priorities, highest first, and has
    no ORDER BY across priorities: which jobs are picked rests on that plan.
    A plan that sorted or hashed the priorities' rows before the cut could pick
    lower-priority jobs over higher ones whenever a window spans priorities.
    Checked on the statement the claim sends, beside many rows of each kind."""
    needs = {"memory_mb": 100}
    shape = shape_of(needs)
    Job.objects.bulk_create(
        Job(
            task_path="tests.testapp.tasks.add",
            args=[1, 1],
            priority=i % 5,
            locality="eu" if i % 3 == 0 else None,
            resources=needs if i % 2 else None,
            resource_shape=shape if i % 2 else None,
        )
        for i in range(5000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_dispatch_job")
    worker = Placement(capacity={"memory_mb": 1000}, locality="eu")
    with statements(connection) as seen:
        taken = claim(worker, limit=8)
    assert len(taken) == 8 and {c.row["priority"] for c in taken} == {4}
    [(pick, params)] = [(sql, p) for sql, p in seen if "RECURSIVE priorities" in sql]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + pick, params)
        plan = cursor.fetchone()[0]
    walks = [
        path
        for path in _paths(plan[0]["Plan"])
        if path[-1].get("CTE Name") == "priorities" and path[-1]["Node Type"] == "CTE Scan"
    ]
    assert len(walks) == 1, walks
    *above, loop, walk = walks[0]
    assert loop["Node Type"] == "Nested Loop" and walk["Parent Relationship"] == "Outer", loop
    assert above[-1]["Node Type"] == "Limit", [n["Node Type"] for n in above]


def _paths(node, above=()):
    """Every node of a JSON plan with the nodes above it, outermost first."""
    path = (*above, node)
    yield path
    for child in node.get("Plans", []):
        yield from _paths(child, path)


def _most_rows(node):
    rows = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
    return max([rows, *(_most_rows(child) for child in node.get("Plans", []))])


def test_auto_resources_follow_the_tasks_history():
    first = rt.estimated.enqueue(1)
    assert Job.objects.get(pk=first.id).resources is None  # no history yet: no needs
    drain()
    for _ in range(3):
        rt.estimated.enqueue(1)
    drain()
    measured = max(JobUsage.objects.values_list("peak_rss_mb", flat=True))
    later = Job.objects.get(pk=rt.estimated.enqueue(1).id)
    assert later.resources == {"memory_mb": int(-(-measured // 1))}
    assert later.resource_shape == shape_of(later.resources)


def test_usage_records_the_resources_held():
    job = rt.big.enqueue("held")
    (claimed,) = claim(mem(1000))
    from django_dispatch.runtime import completer, executor, metering

    metering.start(claimed.id, thread_cpu=True)
    outcome = executor.Outcome(kind="succeeded", return_value=1)
    assert completer.persist(claimed, outcome, give_up_after=1, signal=False)
    assert JobUsage.objects.get(job_id=job.id).resources == {"memory_mb": 600}


# --- real workers ----------------------------------------------------------------


def _overlaps(rows):
    windows = sorted((r.started_at, r.finished_at) for r in rows)
    return [(a, b) for a, b in itertools.pairwise(windows) if b[0] < a[1]]


@pytest.mark.slow
def test_a_1000_mb_worker_never_runs_two_600_mb_jobs_at_once(start_worker):
    for i in range(6):
        rt.big.enqueue(f"big-{i}", 0.2)
    for i in range(6):
        rt.window.enqueue(f"small-{i}", 0.2)
    worker = start_worker("--burst", "--concurrency", "4", "--capacity", "memory_mb=1000")
    assert worker.wait() == 0, worker.output()
    bigs = SideEffect.objects.filter(key__startswith="big-")
    assert bigs.count() == 6 and not _overlaps(bigs)
    smalls = SideEffect.objects.filter(key__startswith="small-")
    assert smalls.count() == 6
    # The small jobs ran beside the big ones: capacity limits only jobs with needs.
    every = list(SideEffect.objects.all())
    assert _overlaps(every)


@pytest.mark.slow
def test_gpu_jobs_run_only_on_the_gpu_worker(start_worker):
    for i in range(4):
        rt.on_gpu.enqueue(f"gpu-{i}")
    for i in range(4):
        rt.window.enqueue(f"cpu-{i}", 0.01)
    cpu = start_worker("--burst", "--capacity", "memory_mb=8000")
    assert cpu.wait() == 0, cpu.output()
    assert SideEffect.objects.filter(key__startswith="cpu-").count() == 4
    assert not SideEffect.objects.filter(key__startswith="gpu-").exists()
    gpu = start_worker("--burst", "--capacity", "gpu=1")
    assert gpu.wait() == 0, gpu.output()
    assert set(
        SideEffect.objects.filter(key__startswith="gpu-").values_list("worker_pid", flat=True)
    ) == {gpu.pid}


@pytest.mark.slow
def test_a_jobs_locality_runs_elsewhere_when_its_workers_are_gone(start_worker):
    jobs = [rt.window.using(locality="eu").enqueue(f"eu-{i}", 0.01) for i in range(3)]
    us = start_worker("--burst", "--locality", "us")
    assert us.wait() == 0, us.output()
    assert SideEffect.objects.filter(key__startswith="eu-").count() == len(jobs)


@pytest.mark.slow
# The control (600 s: the stream alone starves the big job) needs a stream
# that never runs dry; SQLite's single writer cannot promise one on a busy machine.
@pytest.mark.parametrize("threshold", [1.0, pytest.param(600.0, marks=POSTGRES)])
def test_a_big_job_among_a_stream_of_small_ones_runs_within_the_bound(start_worker, threshold):
    """A 900 MB job on a 1000 MB worker kept busy by 100 MB jobs: past the
    starvation threshold (1 s here) the worker stops taking them, and the big
    job starts within the threshold plus one small job's run. The control
    (a threshold of 600 s) shows the stream alone would starve it."""
    small = rt.big.using(resources={"memory_mb": 100})
    worker = start_worker(
        "--concurrency",
        "4",
        "--capacity",
        "memory_mb=1000",
        overrides={"RESOURCE_STARVATION_SECONDS": threshold, "POLL_INTERVAL": 0.05},
    )
    n = 0

    def feed():
        nonlocal n
        if Job.objects.filter(state=JobState.PENDING, resources={"memory_mb": 100}).count() < 16:
            # Staggered lengths: small jobs end one by one, never all in one
            # wave (which would leave the worker empty, and the big job fit).
            enqueue_many(small, [((f"s{n + i}", 0.15 + (n + i) % 7 * 0.05), {}) for i in range(16)])
            n += 16

    feed()
    wait_until(lambda: Job.objects.filter(state=JobState.RUNNING).count() == 4, what="busy")
    big = rt.big.using(resources={"memory_mb": 900}).enqueue("BIG", 0.05)
    began = time.monotonic()
    bound = 1.0 + 0.45 + 3.0  # threshold + the longest small job + slack for a busy machine
    while not SideEffect.objects.filter(key="BIG").exists():
        feed()  # always a backlog of small jobs waiting
        if time.monotonic() - began > bound:
            break
        time.sleep(0.05)
    started = SideEffect.objects.filter(key="BIG").exists()
    assert started == (threshold == 1.0), worker.output()
    assert Job.objects.get(pk=big.id).state != JobState.PENDING or threshold != 1.0
    assert SideEffect.objects.filter(key__startswith="s").count() >= 8  # the stream ran


def test_drain_with_a_capacity_runs_jobs_with_needs():
    rt.big.enqueue("drained", 0.01)
    assert drain() == 0  # like a worker without --capacity
    assert drain(capacity={"memory_mb": 1000}) == 1
    assert SideEffect.objects.filter(key="drained").exists()


def test_drain_without_a_capacity_ends_beside_a_retry_with_needs_it_cannot_run():
    """A job with needs waiting for its retry is made due by each of ``drain``'s
    rounds, and claimed by none of them: two idle rounds end the drain."""
    waiting = rt.big.enqueue("retried", 0.01)
    # As its failed first attempt left it: pending, its attempt spent.
    Job.objects.filter(pk=waiting.id).update(attempts=1)
    tasks.add.enqueue(1, 2)
    ran: list[int] = []

    def run() -> None:
        try:
            ran.append(drain())
        finally:
            connections.close_all()

    drainer = threading.Thread(target=run, daemon=True)  # daemon: a hang fails, not blocks
    drainer.start()
    drainer.join(30)
    assert not drainer.is_alive(), "drain() never ended beside a retry it cannot run"
    assert ran == [1]
    assert Job.objects.get(pk=waiting.id).state == JobState.PENDING


def test_a_lease_written_by_the_resource_claim_equals_the_plain_claims():
    """PostgreSQL leases the rows of a worker with capacity in raw SQL: the
    row must come out as the plain claim's ORM/fused lease leaves it."""
    plain = tasks.add.enqueue(1, 1)
    (a,) = claim(None, worker_id="w1")
    placed = tasks.add.enqueue(2, 2)
    (b,) = claim(mem(10), worker_id="w1")
    assert (a.id, b.id) == (int(plain.id), int(placed.id))
    fields = [
        "state",
        "worker_id",
        "lease_epoch",
        "attempts",
        "worker_ids",
        "worker_lost_count",
    ]
    rows = {r["id"]: r for r in Job.objects.filter(id__in=[a.id, b.id]).values("id", *fields)}
    assert {k: v for k, v in rows[a.id].items() if k != "id"} == {
        k: v for k, v in rows[b.id].items() if k != "id"
    }
    job = Job.objects.get(pk=b.id)
    assert job.started_at == job.last_attempted_at == job.heartbeat_at == b.claimed_at
    assert 29 < (job.lease_expires_at - job.heartbeat_at).total_seconds() <= 30
    assert b.row["lease_epoch"] == job.lease_epoch and b.row["attempts"] == job.attempts


def test_processes_divide_the_hosts_capacity(settings):
    from django_dispatch.management.commands.rundispatch import Command

    options = {"capacity": "memory_mb=1001,gpu=2", "locality": None, "processes": 2}
    assert Command._placement(options) == ({"memory_mb": 500, "gpu": 1}, "")
    # A share of 0 would strand every job needing it: refused, saying what to do.
    options = {"capacity": "memory_mb=1001,gpu=1", "locality": None, "processes": 2}
    with pytest.raises(CommandError, match=r"gpu=1 divided among --processes 2 .*--processes 1"):
        Command._placement(options)
    settings.DISPATCH = {"CAPACITY": {"memory_mb": 300}, "LOCALITY": "eu"}
    options = {"capacity": None, "locality": None, "processes": 1}
    assert Command._placement(options) == ({"memory_mb": 300}, "eu")


@pytest.mark.slow
def test_two_idle_workers_each_take_their_own_localitys_jobs_first(start_worker):
    for i in range(4):
        # 0.4 s each: the second worker starts long before the first ran out
        # of its own jobs.
        rt.window.using(locality="eu").enqueue(f"eu-{i}", 0.4)
        rt.window.using(locality="us").enqueue(f"us-{i}", 0.4)
    eu = start_worker("--burst", "--concurrency", "1", "--locality", "eu")
    us = start_worker("--burst", "--concurrency", "1", "--locality", "us")
    assert eu.wait() == 0 and us.wait() == 0, eu.output() + us.output()
    runs = list(SideEffect.objects.order_by("started_at"))
    assert len(runs) == 8
    for worker, mine in ((eu, "eu-"), (us, "us-")):
        own = [r.key for r in runs if r.worker_pid == worker.pid]
        # Its first job is its own locality's, and so is most of what it ran
        # (the other takes its jobs only once its own are gone).
        assert own[0].startswith(mine), own
        assert sum(key.startswith(mine) for key in own) >= len(own) / 2, own


def test_a_job_given_up_on_holds_its_resources_until_its_code_returns(settings):
    """Past its timeout and grace, a job's thread is given up on (its slot is
    freed) but its code still runs: what it holds stays held until it returns."""
    settings.DISPATCH = {"TIMEOUT_GRACE": 0.2}
    rt.hog.enqueue("hog", 1.5)
    rt.big.enqueue("next", 0.01)
    drain(capacity={"memory_mb": 1000}, concurrency=2)
    hog, after = SideEffect.objects.get(key="hog"), SideEffect.objects.get(key="next")
    assert hog.finished_at <= after.started_at


def test_claims_with_capacity_read_no_deferred_job():
    """As the plain claim (store/test_claim.py), a worker with capacity and a locality walks
    the priorities of each source (jobs without needs, each fitting shape, its
    locality), so an idle poll's work is the same beside 50,000 deferred jobs as
    beside 200 (counted: ``tests.database_work``); it read them all before."""
    needs = {"memory_mb": 100}
    shape = shape_of(needs)

    def deferred(count: int) -> None:
        later = timezone.now() + timedelta(days=1)
        Job.objects.bulk_create(
            Job(
                task_path="tests.testapp.tasks.add",
                args=[1, 1],
                priority=5 if i % 2 else 0,
                locality="eu" if i % 3 == 0 else None,
                resources=needs if i % 4 == 0 else None,
                resource_shape=shape if i % 4 == 0 else None,
                run_after=later + timedelta(seconds=i),
            )
            for i in range(count)
        )
        if connection.vendor == "postgresql":  # SQLite would keep the statistics for later tests
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE django_dispatch_job")

    worker = Placement(capacity={"memory_mb": 1000}, locality="eu")

    def claims_work() -> int:
        claim(worker, limit=8)  # plans and catalog reads made once, outside the count
        small = tasks.add.using(priority=-1, resources=needs).enqueue(1, 1)
        plain = tasks.add.using(priority=-1).enqueue(1, 2)
        with database_work() as work:
            claimed = claim(worker, limit=8)
            assert claim(worker, limit=8) == []  # an idle poll
            assert not store.jobs_due_exist(queues=(), placement=worker)
        assert sorted(c.id for c in claimed) == sorted([int(small.id), int(plain.id)])
        worker.held = {}
        return work.amount

    assert_flat_beside(deferred, claims_work, few=200, many=50_000)
