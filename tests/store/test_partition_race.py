"""The partition race, under real concurrency: no key is ever left blocked.

A partition's jobs behind its head sit in ``blocked``; the transition that
ends the head promotes the next one. Two such transitions on one key at once
(a head finishing while the job behind it is cancelled, a final failure or a
reclaim racing a cancel, two cancels) used to each promote from a snapshot
that missed the other's change, and the key stalled until the leader's sweep.
These tests race every such pair on many keys, from several threads with
their own connections and real transactions, and then require that no key
has a blocked oldest live job with nothing running, that the leader's sweep
finds nothing, and that every job can still be run to its end.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_dispatch import cancel, enqueue_many, store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.runtime import flow_cache
from tests.concurrency import run_concurrently
from tests.store.helpers import claim_as_worker
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

DB = "default"
MAX_WORKER_LOST = 3
JOBS_PER_KEY = 4

#: Keys whose oldest live job is blocked while no job of theirs is active
#: (running, or cancelled and still held): nothing would ever promote them.
_STALLED_SQL = """
SELECT k.partition_key FROM (
    SELECT DISTINCT partition_key FROM django_dispatch_job WHERE state = 'blocked'
) AS k
WHERE (SELECT j.state FROM django_dispatch_job j
        WHERE j.partition_key = k.partition_key AND j.state IN ('pending', 'blocked', 'running')
        ORDER BY j.id LIMIT 1) = 'blocked'
  AND NOT EXISTS (SELECT 1 FROM django_dispatch_job j
        WHERE j.partition_key = k.partition_key
          AND (j.state = 'running' OR (j.state = 'cancelled' AND j.lease_expires_at IS NOT NULL)))
ORDER BY 1
"""


def stalled_keys() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(_STALLED_SQL)
        return [key for (key,) in cursor.fetchall()]


def claim(worker: str = "w", limit: int = 100) -> list[store.ClaimedJob]:
    return claim_as_worker(worker, limit)


def drain_to_the_end(worker: str = "drainer") -> None:
    """Run every job left, as a worker would, without the leader's sweep."""
    for _ in range(1000):
        claimed = claim(worker)
        if not claimed:
            break
        with transaction.atomic():
            store.jobs_finish_many_if_leased([(c.lease, None) for c in claimed])
    left = Job.objects.filter(state__in=[JobState.PENDING, JobState.BLOCKED])
    assert not left.exists(), (
        f"jobs no claim can reach: {list(left.values_list('partition_key', 'id', 'state'))}"
    )


# --- the scenarios: how a head ends, racing a cancel of the job behind it --------


class Key:
    """One partition of the stress: its jobs (oldest first) and the head's claim."""

    def __init__(self, name: str, ids: list[int]) -> None:
        self.name = name
        self.ids = ids
        self.head: store.ClaimedJob | None = None


def _finish(key: Key) -> None:
    assert key.head is not None
    store.job_finish_if_leased(key.head.lease, 1, partition_key=key.name)


def _finish_many(key: Key) -> None:
    # As the worker's cycle does: the wave's successes, then a claim, in one transaction.
    assert key.head is not None
    store.jobs_finish_many_if_leased([(key.head.lease, 1)])
    # (from a queue with no jobs: a claimed job nobody runs would hold its key)
    assert store.jobs_claim(worker_id="cycle", queues=("idle",), limit=1, lease_seconds=30) == []


def _fail_for_good(key: Key) -> None:
    assert key.head is not None
    store.job_fail_if_leased(key.head.lease, [], None, partition_key=key.name)


def _ack_cancelled(key: Key) -> None:
    assert key.head is not None
    store.job_ack_cancelled(key.head.lease, partition_key=key.name)


def _rescue(key: Key) -> None:
    store.jobs_rescue_expired(max_worker_lost=MAX_WORKER_LOST)


def _cancel_head(key: Key) -> None:
    cancel(key.ids[0])


def _prepare(scenario: str, keys: list[Key]) -> None:
    """Bring each key's head into the state its scenario ends it from."""
    for key in keys:
        head = Job.objects.get(pk=key.ids[0])
        assert key.head is not None and head.state == JobState.RUNNING
        if scenario in ("ack_cancelled", "rescue_cancelled"):
            assert cancel(key.ids[0])  # cancelled, still held by its worker
        elif scenario == "rescue_failed":
            Job.objects.filter(pk=key.ids[0]).update(worker_lost_count=MAX_WORKER_LOST - 1)
        elif scenario == "cancel_head":
            store.job_release_if_leased(key.head.lease, attempts=0, worker_ids=[])


def _expire_if_rescued(scenario: str, key: Key) -> None:
    """Just before the race: the head's lease runs out (its worker was lost)."""
    if scenario.startswith("rescue"):
        Job.objects.filter(pk=key.ids[0]).update(lease_expires_at="2000-01-01T00:00:00Z")


ENDINGS: dict[str, Callable[[Key], None]] = {
    "finish": _finish,
    "finish_many": _finish_many,
    "fail_for_good": _fail_for_good,
    "ack_cancelled": _ack_cancelled,
    "rescue_cancelled": _rescue,
    "rescue_failed": _rescue,
    "cancel_head": _cancel_head,
}


def _make_keys(prefix: str, count: int) -> list[Key]:
    keys = []
    for n in range(count):
        name = f"{prefix}-{n}"
        results = enqueue_many(
            tasks.add.using(partition_key=name),
            [((i, i), {}) for i in range(JOBS_PER_KEY)],
            return_results=True,
        )
        keys.append(Key(name, [int(r.id) for r in results]))
    return keys


def _claim_heads(keys: list[Key]) -> None:
    by_id = {key.ids[0]: key for key in keys}
    while claimed := claim("setup"):
        for c in claimed:
            by_id[c.id].head = c
    assert all(key.head is not None for key in keys)
    assert not Job.objects.filter(state=JobState.PENDING).exists()


def _in_slow_transaction(action: Callable[[], Any], rng: random.Random) -> None:
    """Run ``action`` in a transaction that stays open a little after it.

    A caller's own transaction (an admin page, a task cancelling another)
    commits when it is done, not when the store's function returns; the
    pause widens the window in which the two racing transitions overlap.
    """
    with transaction.atomic():
        action()
        pause = rng.choice((0, 0, 0.001, 0.003))
        if pause:
            time.sleep(pause)


def _race_pairs(
    work: list[tuple[str, Key]], racer: Callable[[Key], None], seed: int
) -> tuple[Callable[[], None], Callable[[], None]]:
    """Two threads' bodies: for each (scenario, key) in turn, the first ends
    the key's head as the scenario says while the second runs ``racer`` on the
    key, both at the same moment."""
    barrier = threading.Barrier(2)
    keys = [key for _, key in work]

    def ender() -> None:
        rng = random.Random(seed)
        for scenario, key in work:
            _expire_if_rescued(scenario, key)
            end = ENDINGS[scenario]
            barrier.wait()
            _in_slow_transaction(lambda key=key, end=end: end(key), rng)

    def canceller() -> None:
        rng = random.Random(seed + 1)
        for key in keys:
            barrier.wait()
            _in_slow_transaction(lambda key=key: racer(key), rng)

    return ender, canceller


def _cancel_next(key: Key) -> None:
    assert cancel(key.ids[1])


@pytest.mark.parametrize("scenario", list(ENDINGS))
def test_a_head_ending_while_the_next_job_is_cancelled_never_leaves_the_key_blocked(scenario):
    """Per scenario: 3 pairs of threads x 8 keys; each pair ends a key's head
    and cancels the job behind it at the same moment. The third job must be
    promoted every time, so the sweep finds nothing and every job can run."""
    pairs, per_pair = 3, 8
    keys = _make_keys(scenario, pairs * per_pair)
    _claim_heads(keys)
    _prepare(scenario, keys)
    bodies: list[Callable[[], None]] = []
    for p in range(pairs):
        bodies += _race_pairs([(scenario, k) for k in keys[p::pairs]], _cancel_next, seed=p)
    run_concurrently(*bodies)

    assert stalled_keys() == []
    assert store.partitions_promote_stalled(DB) == 0
    next_ids = [k.ids[1] for k in keys]
    assert Job.objects.filter(id__in=next_ids, state=JobState.CANCELLED).count() == len(keys)
    drain_to_the_end()


def _worker_beside(stop: threading.Event) -> None:
    """A worker beside the race: claims what gets promoted (demoting what it
    must), finishes it in a cycle transaction, lets go of jobs cancelled under it."""
    while not stop.is_set():
        claimed = claim("beside", limit=4)
        with transaction.atomic():
            won = store.jobs_finish_many_if_leased([(c.lease, 2) for c in claimed])
        for c in claimed:
            if c.id not in won:
                store.job_ack_cancelled(c.lease, partition_key=c.row["partition_key"])
        if not claimed:
            time.sleep(0.001)


def _then_stop(bodies: list[Callable[[], None]], stop: threading.Event) -> Callable[[], None]:
    def run() -> None:
        try:
            run_concurrently(*bodies)
        finally:
            stop.set()

    return run


def test_a_mixed_stress_with_a_claiming_worker_leaves_no_key_blocked():
    """Every ending at once on many keys, with a cancel of a random job behind
    each head and a worker claiming (and demoting) and finishing beside them,
    for a few rounds; after each round the key state is checked."""
    rng = random.Random(11)

    def racer(key: Key) -> None:
        cancel(key.ids[rng.choice((1, 1, 2))])

    for round_ in range(3):
        keys_by_scenario = {s: _make_keys(f"r{round_}-{s}", 4) for s in ENDINGS}
        all_keys = [k for keys in keys_by_scenario.values() for k in keys]
        _claim_heads(all_keys)
        for scenario, keys in keys_by_scenario.items():
            _prepare(scenario, keys)
        work = [(s, k) for s, keys in keys_by_scenario.items() for k in keys]
        rng.shuffle(work)
        bodies: list[Callable[[], None]] = []
        for p in range(3):
            bodies += _race_pairs(work[p::3], racer, seed=round_ * 10 + p)
        stop = threading.Event()
        run_concurrently(_then_stop(bodies, stop), lambda stop=stop: _worker_beside(stop))
        assert stalled_keys() == [], f"round {round_}"
        assert store.partitions_promote_stalled(DB) == 0, f"round {round_}"
        drain_to_the_end()


# --- a running job that goes back to the queue behind an older blocked one ---------


def _older_job_demoted_behind_running_newer() -> tuple[int, store.ClaimedJob]:
    """A newer job runs while an older one (committed late) is demoted behind it."""
    newer = tasks.add.using(partition_key="L").enqueue(2, 2)
    (running,) = claim()
    older = Job.objects.create(task_path="tests.testapp.tasks.add", args=[1, 1], partition_key="L")
    older_id = int(newer.id) - 1000
    Job.objects.filter(pk=older.pk).update(id=older_id)
    assert claim() == []  # the older job waits for the running one: demoted
    assert Job.objects.get(pk=older_id).state == JobState.BLOCKED
    return older_id, running


@pytest.mark.parametrize("how", ["retry", "release"])
def test_a_running_job_back_to_pending_promotes_an_older_blocked_head(how):
    """ids are handed out before commit, so a key's older job can appear (and
    be demoted) while a newer one runs. When the newer one goes back to the
    queue, the older one is the head again and must not stay blocked."""
    older_id, running = _older_job_demoted_behind_running_newer()
    if how == "retry":
        assert store.job_fail_if_leased(running.lease, [], retry_in=0, partition_key="L")
    else:
        assert store.job_release_if_leased(running.lease, attempts=0, worker_ids=[])
    assert stalled_keys() == []
    assert [c.id for c in claim()] == [older_id]
    assert store.partitions_promote_stalled(DB) == 0


# --- what the protocol costs ------------------------------------------------------


def _statements(action: Callable[[], Any]) -> list[str]:
    """The SQL statements ``action`` runs in a transaction (BEGIN/COMMIT left out)."""
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        action()
    return [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]


def test_unkeyed_claims_and_completions_take_no_partition_lock():
    enqueue_many(tasks.add, [((i, i), {}) for i in range(4)])
    # Reads the flow state (paused queues) afresh, as a worker does once per
    # poll: a poll long enough that a loaded machine does not read it again below.
    flow_cache.forget_paused()
    claim_as_worker("w", 0, poll_interval=600)
    claimed: list[store.ClaimedJob] = []
    claim_sql = _statements(lambda: claimed.extend(claim_as_worker("w", 4, poll_interval=600)))
    assert len(claimed) == 4
    leases = [(c.lease, 1) for c in claimed]
    finish_sql = _statements(lambda: store.jobs_finish_many_if_leased(leases))
    assert not any("advisory" in sql for sql in claim_sql + finish_sql)
    if connection.vendor == "postgresql":
        # One statement to claim, one to finish: the hot path as it was.
        assert len(claim_sql) == 1 and len(finish_sql) == 1, (claim_sql, finish_sql)


# --- one interleaving, step by step -------------------------------------------------


def test_a_head_finishing_while_the_next_jobs_cancel_is_uncommitted_promotes_the_third():
    """The race, pinned: the cancel of the job behind the head has run but not
    committed when the head finishes. The finish must wait for it (for the
    key's lock on PostgreSQL, the write lock on SQLite) and then promote the
    third job; before the key lock it waited on the second job's row instead,
    found it cancelled and promoted nothing."""
    results = enqueue_many(
        tasks.add.using(partition_key="D"), [((i, i), {}) for i in range(3)], return_results=True
    )
    ids = [int(r.id) for r in results]
    (head,) = claim()
    assert Job.objects.get(pk=ids[2]).state == JobState.BLOCKED
    cancelled, commit = threading.Event(), threading.Event()

    def canceller() -> None:
        with transaction.atomic():
            assert cancel(ids[1])
            cancelled.set()
            assert commit.wait(20)

    def finisher() -> None:
        assert cancelled.wait(20)
        assert store.job_finish_if_leased(head.lease, 1, partition_key="D")

    def conductor() -> None:
        assert cancelled.wait(20)
        time.sleep(0.2)  # the finisher is now waiting on the canceller
        commit.set()

    run_concurrently(canceller, finisher, conductor)
    assert Job.objects.get(pk=ids[2]).state == JobState.PENDING
    assert stalled_keys() == []
    assert store.partitions_promote_stalled(DB) == 0
