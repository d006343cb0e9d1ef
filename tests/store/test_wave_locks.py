"""Lock order: the waves' finishes and the heartbeat's renewal lock a worker's
running rows in id order, whatever order they were handed in or lie in the
heap, so the two (on two connections of one worker) cannot deadlock.

Each test holds the higher id's row locked from another connection, lets the
write run until it waits on it, then asks (without waiting) for the lower
id's row: taken in id order, the write holds it already.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

from django_dispatch import store
from django_dispatch.models import Job
from django_dispatch.store.base import now_plus
from django_dispatch.store.wave import jobs_finish_many_and_claim
from tests.concurrency import run_concurrently
from tests.conftest import postgres_only
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

WORKER = "w-lock-order"
#: Lock requests waiting on this session (``pg_locks``: read afresh each time,
#: unlike ``pg_stat_activity``, which a transaction reads once).
_BLOCKED_BY_ME = (
    "SELECT count(*) FROM pg_locks"
    " WHERE NOT granted AND pg_backend_pid() = ANY(pg_blocking_pids(pid))"
)


def _two_running() -> tuple[store.ClaimedJob, store.ClaimedJob]:
    for i in range(2):
        tasks.add.enqueue(i, i)
    low, high = store.jobs_claim(worker_id=WORKER, queues=(), limit=2, lease_seconds=30)
    assert low.id < high.id
    return low, high


def _holds_low_while_waiting_on_high(low: int, high: int, write: Callable[[], Any]) -> bool:
    """Run ``write`` while another connection holds row ``high``; once ``write``
    waits on it, whether ``write`` already held row ``low``."""
    locked = threading.Event()
    seen: dict[str, bool] = {}

    def hold() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT id FROM django_dispatch_job WHERE id = %s FOR UPDATE", [high])
            locked.set()
            deadline = time.monotonic() + 20
            cursor.execute(_BLOCKED_BY_ME)
            while cursor.fetchone()[0] == 0:
                assert time.monotonic() < deadline, "the write never waited on the held row"
                time.sleep(0.02)
                cursor.execute(_BLOCKED_BY_ME)
            try:
                with transaction.atomic():
                    cursor.execute(
                        "SELECT id FROM django_dispatch_job WHERE id = %s FOR UPDATE NOWAIT", [low]
                    )
                seen["low_held"] = False
            except OperationalError:
                seen["low_held"] = True

    def run_write() -> Any:
        assert locked.wait(30)
        return write()

    run_concurrently(hold, run_write)
    return seen["low_held"]


def test_the_wave_finish_locks_in_id_order_whatever_order_it_was_handed():
    low, high = _two_running()
    results = [(high.lease, None), (low.lease, None)]  # handed over high first
    won: list[set[int]] = []

    def write() -> None:
        won.append(jobs_finish_many_and_claim(results, db="default", claim=None).won)

    assert _holds_low_while_waiting_on_high(low.id, high.id, write)
    assert won == [{low.id, high.id}]


def _low_after_high_in_the_heap(low: int, high: int) -> None:
    """A later version of the lower id's row, in the heap after the higher id's
    and not a HOT update (an indexed column changes: the indexes point at the
    new version), where an UPDATE reading the heap would lock it second."""
    Job.objects.filter(pk=low).update(lease_expires_at=now_plus(60))
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, ctid FROM django_dispatch_job WHERE id IN (%s, %s)", [low, high])
        ctids = {i: tuple(int(p) for p in c.strip("()").split(",")) for i, c in cursor.fetchall()}
    assert ctids[low] > ctids[high]


def test_the_transactional_finish_locks_in_id_order_whatever_the_order_or_the_heap():
    """The finish of a wave written in a transaction (placements, queue limits,
    concurrency groups, staging), which the one-statement wave does not cover."""
    low, high = _two_running()
    _low_after_high_in_the_heap(low.id, high.id)
    results = [(high.lease, None), (low.lease, None)]  # handed over high first
    won: list[set[int]] = []

    def write() -> None:
        won.append(store.jobs_finish_many_if_leased(results))

    assert _holds_low_while_waiting_on_high(low.id, high.id, write)
    assert won == [{low.id, high.id}]


def test_the_heartbeat_renewal_locks_in_id_order_whatever_the_heap_order():
    low, high = _two_running()
    _low_after_high_in_the_heap(low.id, high.id)
    lost: list[set[int]] = []

    def write() -> None:
        lost.append(store.jobs_renew_leases([high.lease, low.lease], lease_seconds=30))

    assert _holds_low_while_waiting_on_high(low.id, high.id, write)
    assert lost == [set()]
