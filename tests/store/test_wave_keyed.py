"""The one-statement wave with partitions (``store.wave``, migration 0030): what
the partition gate does in a transaction, the statement does too.

A keyed success takes its key's lock before any row lock and promotes the
key's next job in the same statement; the claim leases a keyed job only as
its partition's head with nothing of the partition active, demotes those
that wait behind something (where the key's lock is free), and passes the
rest by; every lease is of a row still pending.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from django_dispatch import cancel, store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.store.partitions import LOCK_CLASS
from django_dispatch.store.wave import WaveClaim, jobs_finish_many_and_claim
from tests.concurrency import run_concurrently
from tests.conftest import postgres_only
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

DB = "default"
WORKER = "w-keyed-wave"


def _claim(limit: int) -> list[store.ClaimedJob]:
    return store.jobs_claim(worker_id=WORKER, queues=(), limit=limit, lease_seconds=30)


def _states(*ids: int) -> list[str]:
    by_id = dict(Job.objects.filter(id__in=ids).values_list("id", "state"))
    return [by_id[i] for i in ids]


def _keyed(key: str, n: int) -> list[int]:
    return [int(tasks.add.using(partition_key=key).enqueue(i, 0).id) for i in range(n)]


def test_a_keyed_success_promotes_its_next_job_and_the_same_statement_claims_it():
    k1, k2, k3 = _keyed("K", 3)
    (running,) = _claim(3)  # the head runs; the two behind it are demoted
    assert running.id == k1
    assert _states(k2, k3) == [JobState.BLOCKED, JobState.BLOCKED]
    wave = jobs_finish_many_and_claim([(running.lease, 1)], db=DB, claim=WaveClaim(WORKER, 2, 30.0))
    assert wave.won == {k1}
    assert wave.freed == set()  # promoted in the statement, under the key's lock
    # The promotion came before the claim's scan: the next head is leased at
    # once, the one behind it stays blocked.
    assert [c.id for c in wave.claimed] == [k2]
    assert wave.claimed[0].lease.partition_key == "K"
    assert _states(k1, k2, k3) == [JobState.SUCCEEDED, JobState.RUNNING, JobState.BLOCKED]


def test_only_the_head_is_leased_and_the_jobs_behind_it_are_demoted():
    a1, a2 = _keyed("A", 2)
    b1 = _keyed("B", 1)[0]
    plain = int(tasks.add.enqueue(0, 0).id)
    wave = jobs_finish_many_and_claim([], db=DB, claim=WaveClaim(WORKER, 4, 30.0))
    assert sorted(c.id for c in wave.claimed) == sorted([a1, b1, plain])
    assert (wave.demoted, wave.passed) == (1, 0)
    assert _states(a1, a2, b1, plain) == [
        JobState.RUNNING,
        JobState.BLOCKED,
        JobState.RUNNING,
        JobState.RUNNING,
    ]


def test_a_key_with_an_active_job_leases_nothing_of_it():
    """A running head, and a cancelled job its worker still holds: the pending
    job behind each is not leased (two running jobs of one key never)."""
    (r1,) = [c for c in _claim_after(_keyed("R", 1))]
    (c1,) = [c for c in _claim_after(_keyed("C", 1))]
    assert cancel(str(c1.id))  # cancelled, its worker not told yet: still active
    r2, c2 = _keyed("R", 1)[0], _keyed("C", 1)[0]
    wave = jobs_finish_many_and_claim([], db=DB, claim=WaveClaim(WORKER, 4, 30.0))
    assert wave.claimed == []
    assert wave.demoted == 2
    assert _states(r1.id, r2, c2) == [JobState.RUNNING, JobState.BLOCKED, JobState.BLOCKED]


def _claim_after(ids: list[int]) -> list[store.ClaimedJob]:
    claimed = _claim(len(ids))
    assert [c.id for c in claimed] == ids
    return claimed


def test_a_busy_key_is_passed_by_not_demoted():
    """The demotion never waits for a key's lock: with the lock held elsewhere,
    the job behind the running head is left pending, passed by, for the gates."""
    (head,) = _claim_after(_keyed("L", 1))
    behind = _keyed("L", 1)[0]
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext('L'))", [LOCK_CLASS])
            locked.set()
            assert release.wait(30)

    def wave() -> object:
        assert locked.wait(30)
        try:
            return jobs_finish_many_and_claim([], db=DB, claim=WaveClaim(WORKER, 2, 30.0))
        finally:
            release.set()

    _, result = run_concurrently(hold, wave)
    assert (result.claimed, result.demoted, result.passed) == ([], 0, 1)
    assert _states(head.id, behind) == [JobState.RUNNING, JobState.PENDING]


def test_the_lease_takes_only_rows_still_pending():
    """The lease functions, called on a row that is no longer pending (here
    cancelled), lease nothing: a row that left ``pending`` must never be run."""
    job = int(tasks.add.enqueue(1, 1).id)
    assert cancel(str(job))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT leased, demoted FROM django_dispatch_lease_runnable("
            "ARRAY[%s]::bigint[], ARRAY[NULL]::text[], 'w', 30, now(), '')",
            [job],
        )
        assert cursor.fetchone() == (None, None)
        cursor.execute(
            "SELECT django_dispatch_lease_wave(ARRAY[%s]::bigint[], 'w', 30, now())", [job]
        )
        assert cursor.fetchone() == (0,)
    stored = Job.objects.get(pk=job)
    assert (stored.state, stored.worker_id, stored.attempts) == (JobState.CANCELLED, None, 0)


def test_migration_0030_reverses_to_0027s_functions_and_forward_again():
    from django.core.management import call_command

    def lease_source() -> tuple[str, bool]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT prosrc FROM pg_proc WHERE proname = 'django_dispatch_lease_wave'"
            )
            (source,) = cursor.fetchone()
            cursor.execute(
                "SELECT to_regproc('django_dispatch_lease_runnable') IS NOT NULL"
                " AND to_regproc('django_dispatch_finish_keyed_wave') IS NOT NULL"
            )
            return source, cursor.fetchone()[0]

    call_command("migrate", "django_dispatch", "0028_atomic_success_finished_at", verbosity=0)
    try:
        source, new_functions = lease_source()
        assert "state = 'pending'" not in source and not new_functions
    finally:
        call_command("migrate", "django_dispatch", verbosity=0)
    source, new_functions = lease_source()
    assert "state = 'pending'" in source and new_functions


def test_two_workers_waves_drain_keys_one_job_at_a_time_oldest_first():
    """Two workers' one-statement waves race over five keys: every job runs
    once, each key's jobs in id order, and no key ever stalls (the partial
    unique index would fail a wave that leased a second running job of a key)."""
    import time

    keys = ("a", "b", "c", "d", "e")
    for _ in range(6):
        for key in keys:
            tasks.add.using(partition_key=key).enqueue(0, 0)
    started: list[tuple[str, int]] = []
    lock = threading.Lock()

    def worker(name: str) -> int:
        claim = WaveClaim(name, 3, 30.0)
        running: list[store.ClaimedJob] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            results = [(c.lease, None) for c in running]
            wave = jobs_finish_many_and_claim(results, db=DB, claim=claim)
            assert wave.won == {c.id for c in running}
            running = wave.claimed
            with lock:
                started.extend((c.lease.partition_key, c.id) for c in running)
            if not running and not Job.objects.exclude(state=JobState.SUCCEEDED).exists():
                return 0
        raise AssertionError("the keys did not drain within 60 s")

    run_concurrently(lambda: worker("w1"), lambda: worker("w2"), together=True, timeout=90)
    assert len(started) == 30 and len({job_id for _, job_id in started}) == 30
    for key in keys:
        ids = [job_id for k, job_id in started if k == key]
        assert ids == sorted(ids) and len(ids) == 6
