"""The wave as one statement (``store.wave``): a worker's successes, their usage
records and the claim that refills their slots, in one round trip that is
its own transaction.

What must hold is what holds for the wave written as a transaction
(``jobs_finish_many_if_leased`` then ``jobs_claim``): each success fenced by
its lease, a record for each winner only, the claim in claim order with the
very lease ``jobs_claim`` writes, and a keyed job leased only as the
partition gate would (tests/store/test_wave_keyed.py).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_dispatch import cancel, store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job, JobUsage
from django_dispatch.runtime import metering
from django_dispatch.store.base import hot_cursor
from django_dispatch.store.leasing import claimed_job
from django_dispatch.store.sources.fused_pg import claim_sql, claimed_records, claimed_rows
from django_dispatch.store.types import CLAIM_FIELDS
from django_dispatch.store.usage import UsageEntry
from django_dispatch.store.wave import WaveClaim, jobs_finish_many_and_claim
from tests.conftest import postgres_only
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

DB = "default"
WORKER = "w-one-statement"


def _claim(limit: int) -> list[store.ClaimedJob]:
    return store.jobs_claim(worker_id=WORKER, queues=(), limit=limit, lease_seconds=30)


def _usage(claimed: list[store.ClaimedJob]) -> dict[int, UsageEntry]:
    entries = {}
    for c in claimed:
        metering.start(c.id, thread_cpu=True).stop()
        entries[c.id] = metering.entry(c, "succeeded")
        metering.forget(c.id, metering.METERS.get(c.id))
    return entries


def test_one_statement_finishes_fenced_records_winners_and_claims_in_order():
    for i in range(3):
        tasks.add.enqueue(i, i)
    running = _claim(3)
    assert len(running) == 3
    assert cancel(str(running[1].id))  # its fence must fail: no success, no record
    low = [int(tasks.add.using(priority=-5).enqueue(i, 0).id) for i in range(3)]
    high = int(tasks.add.using(priority=10).enqueue(0, 1).id)
    keyed = int(tasks.add.using(partition_key="K", priority=20).enqueue(0, 2).id)
    results = [(c.lease, c.id * 10) for c in running]
    with CaptureQueriesContext(connection) as queries:
        wave = jobs_finish_many_and_claim(
            results,
            db=DB,
            claim=WaveClaim(WORKER, 3, 30.0),
            usage=_usage(running),
        )
    assert [q["sql"] for q in queries.captured_queries if q["sql"] in ("BEGIN", "COMMIT")] == []
    assert len(queries.captured_queries) == 1  # one round trip, its own transaction
    assert not connection.in_atomic_block
    winners = {running[0].id, running[2].id}
    assert wave.won == winners
    for job_id in winners:
        job = Job.objects.get(pk=job_id)
        assert (job.state, job.return_value, job.lease_expires_at) == (
            JobState.SUCCEEDED,
            job_id * 10,
            None,
        )
    assert Job.objects.get(pk=running[1].id).state == JobState.CANCELLED
    recorded = sorted(JobUsage.objects.values_list("job_id", "outcome", "worker_id"))
    assert recorded == sorted((i, "succeeded", WORKER) for i in winners)
    # The window is the free slots, in claim order; the keyed job is its
    # partition's head with nothing of it running: leased as the gate would.
    assert [c.id for c in wave.claimed] == [keyed, high, low[0]]
    assert (wave.passed, wave.demoted) == (0, 0)
    pending = Job.objects.filter(state=JobState.PENDING).values_list("id", flat=True)
    assert sorted(pending) == sorted([low[1], low[2]])
    for claimed in wave.claimed:  # the lease as written, as jobs_claim's rows say it
        job = Job.objects.get(pk=claimed.id)
        assert job.state == JobState.RUNNING
        assert (job.worker_id, job.lease_epoch) == (WORKER, claimed.lease.epoch)
        row = claimed.row
        assert (row["attempts"], row["worker_ids"]) == (job.attempts, job.worker_ids)
        assert (row["started_at"], row["lease_epoch"]) == (job.started_at, job.lease_epoch)
        assert claimed.claimed_at == job.last_attempted_at
        assert claimed.lease.partition_key == ("K" if claimed.id == keyed else None)


def test_each_claimed_row_is_the_row_as_its_lease_left_it():
    """What the task runs from is what the table holds once the statement committed
    (``leasing.claimed_job`` applies the lease to the values read before it)."""
    for p in (1, 3, 2):
        tasks.add.using(priority=p).enqueue(p, 0)
    wave = jobs_finish_many_and_claim([], db=DB, claim=WaveClaim(WORKER, 2, 30.0))
    assert (wave.won, wave.passed, len(wave.claimed)) == (set(), 0, 2)
    for claimed in wave.claimed:
        stored = Job.objects.values(*CLAIM_FIELDS).get(pk=claimed.id)
        assert {name: claimed.row[name] for name in CLAIM_FIELDS} == stored
    assert [c.row["priority"] for c in wave.claimed] == [3, 2]


def test_claimed_records_equals_claimed_rows_then_claimed_job():
    """The wave's one pass over its records gives what ``claimed_rows`` then
    ``leasing.claimed_job`` give: the same rows (values, keys, key order), leases
    and clocks, and the same rows only locked."""
    tasks.add.enqueue(1, 2)
    tasks.add.using(partition_key="K", priority=5).enqueue(3, 4)
    tasks.add.enqueue(5, 6)
    Job.objects.filter(args=[5, 6]).update(errors=[{"a": 1}], worker_ids=["before"])
    sql = claim_sql(queues=False, exclude=False, db=DB)
    params = {"window": 3, "lease": 2, "worker_id": WORKER, "lease_seconds": 30.0,
              "queues": [], "exclude": [], "paused": [], "limited": []}  # fmt: skip
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        records = [("x", *record) for record in cursor.fetchall()]
    jobs, locked = claimed_records(records, 1, WORKER, "ns")
    leased, expected_locked = claimed_rows(records, skip=1)
    now = leased[0]["db_now"]
    expected = [claimed_job(row, WORKER, now, "ns") for row in leased]
    assert len(jobs) == 2 and len(locked) == 1  # the keyed one is only locked here
    assert locked == expected_locked
    assert [list(r.row.items()) for r in jobs] == [list(r.row.items()) for r in expected]
    assert [(r.lease, r.lease.partition_key, r.lease.namespace, r.claimed_at) for r in jobs] == [
        (r.lease, r.lease.partition_key, r.lease.namespace, r.claimed_at) for r in expected
    ]
    assert jobs[1].row["worker_ids"] == ["before", WORKER]


def test_a_wave_without_free_slots_only_finishes():
    tasks.add.enqueue(1, 1)
    (claimed,) = _claim(1)
    tasks.add.enqueue(2, 2)  # pending, and must stay so: no slot was asked for
    wave = jobs_finish_many_and_claim(
        [(claimed.lease, None)], db=DB, claim=WaveClaim(WORKER, 0, 30.0)
    )
    assert (wave.won, wave.claimed, wave.passed) == ({claimed.id}, [], 0)
    assert Job.objects.filter(state=JobState.PENDING).count() == 1
    assert JobUsage.objects.count() == 0  # none handed over, none written


def test_paused_queues_and_served_queues_are_filtered():
    tasks.echo.enqueue("emails")  # queue "emails", priority 5
    plain = int(tasks.add.enqueue(1, 1).id)
    paused = jobs_finish_many_and_claim(
        [], db=DB, claim=WaveClaim(WORKER, 5, 30.0, paused=["emails"])
    )
    assert [c.id for c in paused.claimed] == [plain]
    served = jobs_finish_many_and_claim(
        [], db=DB, claim=WaveClaim(WORKER, 5, 30.0, queues=["default"])
    )
    assert served.claimed == []  # the only job left is in "emails"


def test_a_worker_drains_keyed_and_plain_jobs_in_order_with_one_statement_waves():
    """A worker's waves go through the one statement, keyed successes and keyed
    claims included: each key's jobs still run one at a time, oldest first,
    and every job runs once.

    The worker is ``testing.drain``'s, but polling every 5 s rather than
    every 10 ms: a wave that stages takes the transaction, and staging is due
    every half poll interval, which on a slow machine would be every wave."""
    from dataclasses import replace

    from django_dispatch.conf import get_settings
    from django_dispatch.runtime.options import WorkerOptions
    from django_dispatch.runtime.worker import Worker
    from django_dispatch.tasks.registry import backend_for
    from tests.testapp.models import Execution

    plain = [f"plain-{i}" for i in range(40)]
    for key in plain:
        tasks.record.enqueue(key)
    keyed = {k: [f"{k}-{i}" for i in range(5)] for k in ("A", "B")}
    for i in range(5):
        for k, keys in keyed.items():
            tasks.record.using(partition_key=k).enqueue(keys[i])
    worker = Worker(
        WorkerOptions(
            worker_id=WORKER,
            namespace=getattr(backend_for("default"), "namespace", ""),
            concurrency=4,
            burst=True,
            scheduler=False,
        ),
        settings=replace(get_settings(), POLL_INTERVAL=5.0, LISTEN=False),
        close_connections=False,
    )
    with CaptureQueriesContext(connection) as queries:
        worker.run()  # --burst: returns once nothing runs and nothing is due
    assert worker.claimed_total == 50
    ran = list(Execution.objects.order_by("id").values_list("key", flat=True))
    assert sorted(ran) == sorted([*plain, *keyed["A"], *keyed["B"]])
    for keys in keyed.values():
        assert [k for k in ran if k in keys] == keys  # FIFO within the partition
    # The one-statement wave is the finish's function and the claim's candidates together.
    waves = [
        q["sql"]
        for q in queries.captured_queries
        if "django_dispatch_finish_wave(" in q["sql"] and "candidates AS" in q["sql"]
    ]
    assert waves, "no wave went through the one statement"
    keyed_waves = [q for q in queries.captured_queries if "finish_keyed_wave(" in q["sql"]]
    assert keyed_waves, "no wave freeing a partition key went through the one statement"


def test_a_wave_beside_a_backlog_reads_by_index_only_what_it_writes_and_claims():
    """The wave's functions keep one plan per server session, made generic: it
    must be the primary key for the finish and the lease and the claim index,
    read in order up to the window, for the scan, whatever the table holds. The
    backend's scan counters (``pg_stat_xact_user_tables``, which count the
    functions' statements too; read before and after, as they may still hold
    earlier transactions' counts) show it: no sequential scan, and rows fetched
    by index in proportion to the wave, not to the 3,000 jobs waiting."""
    from django.db import transaction

    from django_dispatch import enqueue_many

    enqueue_many(tasks.noop, [((), {}) for _ in range(3000)])
    claim = WaveClaim(WORKER, 8, 30.0)
    wave = jobs_finish_many_and_claim([], db=DB, claim=claim)
    for _ in range(6):  # past the session's first calls, whatever plans they made
        results = [(c.lease, None) for c in wave.claimed]
        wave = jobs_finish_many_and_claim(results, db=DB, claim=claim, usage=_usage(wave.claimed))
        assert len(wave.won) == len(results) == 8
    results = [(c.lease, None) for c in wave.claimed]
    counters = (
        "SELECT seq_scan, idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = %s::regclass"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(counters, [Job._meta.db_table])
        seq_before, fetched_before = cursor.fetchone()
        wave = jobs_finish_many_and_claim(results, db=DB, claim=claim, usage=_usage(wave.claimed))
        cursor.execute(counters, [Job._meta.db_table])
        seq_after, fetched_after = cursor.fetchone()
    assert len(wave.won) == 8 and len(wave.claimed) == 8
    assert seq_after == seq_before
    fetched = fetched_after - fetched_before  # 8 finished, 8 scanned, 8 leased
    assert fetched <= 32, (
        f"the wave fetched {fetched} job rows by index for 8 finished and 8 claimed"
    )
