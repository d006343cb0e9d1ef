"""The only writer of event rows: publish, lease (subscribe), ack, purge.

Publish is one INSERT in the caller's transaction (a savepoint inside it), so
an event published in a transaction that rolls back never existed. The
caller's ``on_publish`` hooks run in that same transaction, under the lock
below: that is how the steps waiting on the event are woken (the workflow
store's ``waits.wake_waiting_steps``), without this module knowing about
workflows. Events sit below workflows: waits read events and take their
lock, so the arrow points from ``workflows.waits`` to here, never back. On
PostgreSQL a publish also NOTIFYs the namespace's event channel, delivered
at commit, so a waiting ``subscribe`` returns at once.

The lost wake-up between a publish and a step recording its wait is closed
by a transaction-level advisory lock on (namespace, name): publishes take it
shared (they never wait for each other), a wait being recorded takes it
exclusive. So a wait is recorded either after every concurrent publish of
that name committed (and its look-back finds the event) or before the
publish's hooks read the waiting steps (and wake it). SQLite has one
writer at a time, which serializes the same way.

Subscribe is queue semantics: the oldest unacked event is leased to one
caller (SKIP LOCKED on PostgreSQL; SQLite's write lock) for
``EVENT_LEASE_SECONDS``; ``ack`` is a compare-and-set on ``acked_at``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Now

from ..core.workflow_states import RunState, StepState
from ..models import Event, WorkflowTask
from .base import NOTIFY_CHANNEL, db_alias, delete_in_batches, now_plus, take_sqlite_write_lock

#: The first key of the event-name locks (two-key ``pg_advisory_xact_lock``).
LOCK_CLASS = 0x44535645  # "DSVE"

#: ``hook(db, event)``: run inside a publish's transaction, under the shared
#: event-name lock, once the event row is inserted. An exception rolls the
#: publish back.
PublishHook = Callable[[str, Event], object]


def event_channel(namespace: str = "") -> str:
    """The LISTEN/NOTIFY channel of ``namespace``'s events (not the workers' job channel)."""
    suffix = f"_{hashlib.md5(namespace.encode()).hexdigest()[:16]}" if namespace else ""
    return f"{NOTIFY_CHANNEL}_events{suffix}"


def lock_event_name(db: str, namespace: str, name: str, *, shared: bool) -> None:
    """Take the (namespace, name) lock until the transaction ends (PostgreSQL only)."""
    connection = connections[db]
    if connection.vendor != "postgresql":
        return
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s, hashtext(%s))", [LOCK_CLASS, f"{namespace}:{name}"])


def event_publish(
    name: str,
    payload: Any,
    *,
    key: str | None,
    namespace: str,
    on_publish: Sequence[PublishHook] = (),
    db: str | None = None,
) -> int:
    """Insert an event and run ``on_publish`` on it, in one transaction; return its id.

    The caller validated the name, key and payload.
    """
    db = db or db_alias()
    with transaction.atomic(using=db):
        lock_event_name(db, namespace, name, shared=True)
        event = Event(namespace=namespace, name=name, key=key, payload=payload)
        event.save(using=db, force_insert=True)
        for hook in on_publish:
            hook(db, event)
        connection = connections[db]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [event_channel(namespace), name])
    return event.pk


def event_lease(
    name: str, *, key: str | None, namespace: str, lease_seconds: float, db: str | None = None
) -> Event | None:
    """Lease the oldest deliverable event of ``name`` (and ``key``) to the caller, or None.

    Deliverable: not acked, and never leased or its lease ran out. A first
    read without locks keeps an idle subscriber's poll from taking SQLite's
    write lock; the lease itself is a locked read (SKIP LOCKED: two
    subscribers never get one event) and an update in one transaction.
    """
    db = db or db_alias()
    deliverable = Event.objects.using(db).filter(
        Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=Now()),
        namespace=namespace,
        name=name,
        acked_at__isnull=True,
    )
    if key is not None:
        deliverable = deliverable.filter(key=key)
    if not deliverable.exists():
        return None
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        event_id = (
            deliverable.order_by("id")
            .select_for_update(skip_locked=True)
            .values_list("id", flat=True)
            .first()
        )
        if event_id is None:
            return None
        Event.objects.using(db).filter(id=event_id).update(
            lease_expires_at=now_plus(lease_seconds), deliveries=F("deliveries") + 1
        )
        return Event.objects.using(db).get(id=event_id)


def event_ack(event_id: int, *, namespace: str, db: str | None = None) -> bool:
    """Mark an event consumed: True only for the call that did (compare-and-set)."""
    db = db or db_alias()
    return (
        Event.objects.using(db)
        .filter(id=event_id, namespace=namespace, acked_at__isnull=True)
        .update(acked_at=Now(), lease_expires_at=None)
        == 1
    )


def events_purge(
    retention: float,
    *,
    batch: int,
    max_seconds: float,
    namespace: str = "",
    db: str | None = None,
) -> int:
    """Delete ``namespace``'s events acked more than ``retention`` seconds ago.

    Bounded batches (each a short statement) until none is left or
    ``max_seconds`` pass; unacked events are ``events_purge_unacked``'s.
    Returns how many were deleted.
    """
    db = db or db_alias()
    old = Event.objects.using(db).filter(namespace=namespace, acked_at__lt=now_plus(-retention))
    return delete_in_batches(old, "acked_at", batch=batch, max_seconds=max_seconds)


def events_purge_unacked(
    retention: float,
    *,
    batch: int,
    max_seconds: float,
    namespace: str = "",
    db: str | None = None,
) -> int:
    """Delete ``namespace``'s events nobody acked, published more than
    ``retention`` seconds ago, except those a waiting workflow step could
    still receive; return how many were deleted.

    A step waiting on an event's name (and its key, when the wait names one)
    in a run that is still running and began no later than the event may
    take it at one of its next waits: a wait looks back over every event of
    its name published since its run began. Such an event stays until no
    such step waits. A run that waits for a name only later is not known
    here: its look-back finds only what the retention kept.

    Reads only workflow tables' rows (models); writes only events. Bounded
    batches, oldest first, as ``events_purge``.
    """
    db = db or db_alias()
    waiting = WorkflowTask.objects.using(db).filter(
        Q(wait_event_key__isnull=True) | Q(wait_event_key=OuterRef("key")),
        namespace=namespace,
        state=StepState.WAITING,
        wait_event_name=OuterRef("name"),
        run__state=RunState.RUNNING,
        run__created_at__lte=OuterRef("published_at"),
    )
    old = (
        Event.objects.using(db)
        .filter(namespace=namespace, acked_at__isnull=True, published_at__lt=now_plus(-retention))
        .exclude(Exists(waiting))
    )
    return delete_in_batches(old, "published_at", batch=batch, max_seconds=max_seconds)
