"""Flow control in the store: paused queues, and what the claim needs to know of them.

Pausing is a row in ``PausedQueue`` (``queue_pause``/``queue_resume``); the
claim leaves out the jobs of paused queues. Running jobs are not touched and
enqueue keeps inserting: a pause only stops *starts*.

How a worker learns of a pause without paying a query per claim: the claim
takes the caller's ``FlowState`` (paused set, whether any group waits), which
a worker keeps per namespace (``runtime.flow_cache``) and refreshes with
``flow_state_read`` once per poll interval, and at once when a pause or
resume is announced: on PostgreSQL by the NOTIFY that ``queue_pause`` and
``queue_resume`` send (payload ``FLOW_PAYLOAD`` on the namespace's channel)
to every listening worker. So a pause takes effect within one poll interval
everywhere, and at once on PostgreSQL with LISTEN on. When nothing is paused
the claim statement is the plain one: the filter is added only for a
non-empty set.

Known cost: a paused queue's due jobs stay in the claim index, so a claim
reads past those that come before the runnable ones in claim order (a paused
queue of higher priority than the others, or older). Pausing is meant for
minutes to hours; see docs/operating.md#pausing-queues.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, connections, transaction

from ..conf import queue_limits
from ..models import ConcurrencyWait
from ..models.flow import PausedQueue
from .base import notify_channel
from .enqueue import jobs_insert
from .types import CallChunk, FlowState, JobSpec

#: The NOTIFY payload that tells listening workers the paused set changed
#: (job inserts notify with an empty payload).
FLOW_PAYLOAD = "flow"


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
    _announce(db, namespace)
    return True


def queue_resume(db: str, name: str, *, namespace: str = "") -> bool:
    """Resume queue ``name`` of ``namespace``; True only when this call resumed it.

    The notification also wakes idle workers, so the queue's backlog starts
    at once rather than at the next poll.
    """
    deleted, _ = PausedQueue.objects.using(db).filter(namespace=namespace, queue_name=name).delete()
    if deleted:
        _announce(db, namespace)
    return bool(deleted)


def queues_paused(db: str, *, namespace: str = "") -> set[str]:
    """The paused queues of ``namespace``, read now (not cached)."""
    return set(
        PausedQueue.objects.using(db)
        .filter(namespace=namespace)
        .values_list("queue_name", flat=True)
    )


def _announce(db: str, namespace: str) -> None:
    """Tell the namespace's listening workers (PostgreSQL, at commit): the paused set changed."""
    connection = connections[db]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [notify_channel(namespace), FLOW_PAYLOAD])


#: The paused queues, and one NULL row if any concurrency group waits: one
#: statement per refresh. Plain SQL for the LIMIT inside a UNION (SQLite).
_FLOW_STATE_SQL = """
SELECT queue_name FROM {paused} WHERE namespace = %s
UNION ALL
SELECT NULL FROM (SELECT 1 FROM {waits} WHERE namespace = %s LIMIT 1) AS w
"""


def flow_state_read(db: str, namespace: str) -> FlowState:
    """The flow state of ``namespace`` read now: its paused queues, whether any
    concurrency group waits (one small statement, ``_FLOW_STATE_SQL``), and the
    queue limits of ``DISPATCH["QUEUES"]``."""
    connection = connections[db]
    sql = _FLOW_STATE_SQL.format(
        paused=connection.ops.quote_name(PausedQueue._meta.db_table),
        waits=connection.ops.quote_name(ConcurrencyWait._meta.db_table),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [namespace, namespace])
        names = [name for (name,) in cursor.fetchall()]
    paused = frozenset(n for n in names if n is not None)
    return FlowState(paused=paused, waiting=None in names, limits=queue_limits())


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
    spec: JobSpec,
    chunks: Sequence[CallChunk],
    *,
    db: str,
    call_context: tuple[str, Any] | None = None,
) -> tuple[list[int], list[Any]]:
    """``enqueue_many``'s insert for a task with a concurrency limit: through the ORM.

    The raw INSERT of ``jobs_insert_calls`` names a fixed list of columns;
    keeping limited jobs off it leaves the plain hot path exactly as it was.
    All or nothing, like that function.
    """
    jobs = [
        spec.new_job(args, kwargs, call_context)
        for chunk in chunks
        for args, kwargs in chunk.values
    ]
    with transaction.atomic(using=db, savepoint=False):
        jobs_insert(jobs, db=db)
    return [job.pk for job in jobs], [job.enqueued_at for job in jobs]
