"""Flow control in the store: paused queues, and what the claim needs to know of them.

Pausing is a row in ``PausedQueue`` (``queue_pause``/``queue_resume``); the
claim leaves out the jobs of paused queues. Running jobs are not touched and
enqueue keeps inserting: a pause only stops *starts*.

How a worker learns of a pause without paying a query per claim: the claim
reads the namespace's paused set from a per-process cache
(``paused_for_claim``), refreshed by one small SELECT when it is older than
the poll interval, and at once when invalidated: by ``queue_pause`` and
``queue_resume`` in this process, and, on PostgreSQL, by the NOTIFY they
send (payload ``FLOW_PAYLOAD`` on the namespace's channel) to every
listening worker (``runtime.listener`` calls ``forget_paused``). So a pause
takes effect within one poll interval everywhere, and at once on PostgreSQL
with LISTEN on. When nothing is paused the claim statement is the plain one:
the filter is added only for a non-empty set.

The cache entry is stamped with the time *before* its SELECT, and an
invalidation is stamped too; an entry is used only if it was read after the
last invalidation. So a refresh that raced a NOTIFY (its SELECT began before
the pause committed) is never taken for fresh.

Known cost: a paused queue's due jobs stay in the claim index, so a claim
reads past those that come before the runnable ones in claim order (a paused
queue of higher priority than the others, or older). Pausing is meant for
minutes to hours; see docs/operating.md#pausing-queues.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, connections, transaction

from ..models.flow import PausedQueue
from .base import notify_channel
from .enqueue import CallChunk, JobSpec, jobs_insert

#: The NOTIFY payload that tells listening workers the paused set changed
#: (job inserts notify with an empty payload).
FLOW_PAYLOAD = "flow"

#: ``(db, namespace) -> (read at, paused set)``; ``read at`` is monotonic,
#: taken before the SELECT.
_cache: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}
_invalidated_at = 0.0
_lock = threading.Lock()


def queue_pause(db: str, name: str, *, namespace: str = "") -> bool:
    """Pause queue ``name`` of ``namespace``; True only when this call paused it.

    One INSERT under the unique constraint (in a savepoint, so a caller's
    transaction survives the conflict); on PostgreSQL it also notifies the
    namespace's workers, delivered when the transaction commits.
    """
    try:
        with transaction.atomic(using=db):
            PausedQueue.objects.using(db).create(namespace=namespace, queue_name=name)
    except IntegrityError:
        return False
    _changed(db, namespace)
    return True


def queue_resume(db: str, name: str, *, namespace: str = "") -> bool:
    """Resume queue ``name`` of ``namespace``; True only when this call resumed it.

    The notification also wakes idle workers, so the queue's backlog starts
    at once rather than at the next poll.
    """
    deleted, _ = PausedQueue.objects.using(db).filter(namespace=namespace, queue_name=name).delete()
    if deleted:
        _changed(db, namespace)
    return bool(deleted)


def queues_paused(db: str, *, namespace: str = "") -> set[str]:
    """The paused queues of ``namespace``, read now (not cached)."""
    return set(
        PausedQueue.objects.using(db)
        .filter(namespace=namespace)
        .values_list("queue_name", flat=True)
    )


def _changed(db: str, namespace: str) -> None:
    forget_paused()
    connection = connections[db]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [notify_channel(namespace), FLOW_PAYLOAD])


def forget_paused() -> None:
    """Invalidate every cached paused set: the next claim reads it again.

    Called from the listener thread on a flow notification; safe from any thread.
    """
    global _invalidated_at
    with _lock:
        _invalidated_at = time.monotonic()
        _cache.clear()


def paused_for_claim(db: str, namespace: str, max_age: float) -> frozenset[str]:
    """The paused queues of ``namespace`` as the claim should see them.

    From the cache when it is younger than ``max_age`` seconds (the poll
    interval) and was read after the last invalidation; otherwise one SELECT
    on the small ``PausedQueue`` table, which the caller runs inside its
    claim transaction.
    """
    key = (db, namespace)
    now = time.monotonic()
    entry = _cache.get(key)
    if entry is not None and now - entry[0] < max_age and entry[0] > _invalidated_at:
        return entry[1]
    paused = frozenset(queues_paused(db, namespace=namespace))
    with _lock:
        if now > _invalidated_at:
            _cache[key] = (now, paused)
    return paused


def claimable_queues(queues: Sequence[str], paused: frozenset[str]) -> tuple[list[str], list[str]]:
    """The claim's queue filter with pauses applied: (queues to keep, queues to leave out).

    A worker serving named queues simply drops the paused ones from its list
    (no new SQL); one serving every queue leaves the paused ones out with
    ``NOT (queue_name = ANY(...))`` (``PAUSED_FILTER_SQL``). When every
    queue a worker serves is paused, the first list is empty although
    ``queues`` was not: the caller must claim nothing (empty means "every
    queue" to the claim query).
    """
    if not paused:
        return list(queues), []
    if queues:
        return [q for q in queues if q not in paused], []
    return [], sorted(paused)


#: The fused claim statement's filter for ``claimable_queues``' second list.
PAUSED_FILTER_SQL = " AND NOT (queue_name = ANY(%(paused)s))"


def jobs_insert_limited(
    spec: JobSpec, chunks: Sequence[CallChunk], *, db: str
) -> tuple[list[int], list[Any]]:
    """``enqueue_many``'s insert for a task with a concurrency limit: through the ORM.

    The raw INSERT of ``jobs_insert_calls`` names a fixed list of columns;
    keeping limited jobs off it leaves the plain hot path exactly as it was.
    All or nothing, like that function.
    """
    jobs = [spec.new_job(args, kwargs) for chunk in chunks for args, kwargs in chunk.values]
    with transaction.atomic(using=db, savepoint=False):
        jobs_insert(jobs, db=db)
    return [job.pk for job in jobs], [job.enqueued_at for job in jobs]
