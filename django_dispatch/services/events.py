"""Events: publish / subscribe / ack, in the database the site already has.

::

    from django_dispatch import events

    with transaction.atomic():
        order.save()
        events.publish("payment.received", {"amount": 42}, key=f"order:{order.pk}")

    event = events.subscribe("payment.received", timeout=10)   # leased to us
    if event is not None:
        handle(event.payload)
        events.ack(event.id)

``publish`` is one INSERT in the caller's transaction: an event published in
a transaction that rolls back never existed. It also wakes every workflow
step waiting on it (``ctx.wait_for_event``: each run gets its own copy),
while ``subscribe`` hands each event to one subscriber at a time (a lease
of ``DISPATCH["EVENT_LEASE_SECONDS"]``, delivered again if not acked in
time). See docs/events.md.

Workflows sit above events (a step's wait reads events), so this module
never imports them. The wake-up is a hook instead: the app's ``ready()``
registers ``workflows.hooks.wake_waiting_steps`` with ``on_publish``, and
every publish runs the registered hooks in its own transaction, under the
event-name lock that closes the race with a wait being recorded (see
``store.events``). A hook set at startup, rather than an import made here,
keeps the arrow one way and still reaches every process that publishes,
whether or not it ever imported a workflow.

Every function takes ``backend=`` (a ``TASKS`` alias, default
``"default"``): events live in that backend's namespace.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from ..conf import get_settings
from ..models import Event
from ..models.event import EVENT_NAME_MAX_LENGTH
from ..models.job import KEY_MAX_LENGTH
from ..store import db_alias, using_backend
from ..store import events as events_store
from ..tasks.registry import namespace_for
from ..tasks.values import to_json

__all__ = ["Event", "ack", "asubscribe", "check_key", "check_name", "publish", "subscribe"]

#: What each publish runs in its transaction (see the module docstring).
_publish_hooks: list[events_store.PublishHook] = []


def on_publish(hook: events_store.PublishHook) -> events_store.PublishHook:
    """Run ``hook(db, event)`` inside every publish's transaction, under the event-name lock.

    Registering the same hook again changes nothing (``ready()`` may run more
    than once in tests). Returns the hook, so it can be used as a decorator.
    """
    if hook not in _publish_hooks:
        _publish_hooks.append(hook)
    return hook


def check_name(name: object) -> str:
    """An event name, or ValueError saying what a valid one is."""
    if not isinstance(name, str) or not name or len(name) > EVENT_NAME_MAX_LENGTH:
        raise ValueError(
            f"an event name must be a non-empty string of at most {EVENT_NAME_MAX_LENGTH} "
            f"characters, got {name!r}."
        )
    return name


def check_key(key: object) -> str | None:
    """An event key (None: no key), or ValueError saying what a valid one is."""
    if key is not None and (not isinstance(key, str) or not key or len(key) > KEY_MAX_LENGTH):
        raise ValueError(
            f"an event key must be None or a non-empty string of at most {KEY_MAX_LENGTH} "
            f"characters, got {key!r}."
        )
    return key


def check_timeout(timeout: object, what: str = "timeout") -> float:
    """Seconds (a number, zero or more), or ValueError."""
    if (
        not isinstance(timeout, int | float)
        or isinstance(timeout, bool)
        or timeout != timeout
        or timeout < 0
    ):
        raise ValueError(f"{what} must be a number of seconds, zero or more; got {timeout!r}.")
    return float(timeout)


def publish(
    name: str, payload: Any = None, *, key: str | None = None, backend: str = "default"
) -> int:
    """Persist an event in the caller's transaction; return its id.

    ``payload`` must be JSON (``InvalidTaskArguments``, a ``TypeError``,
    otherwise); the name and key are checked first (``ValueError``). Nothing
    is written when anything is refused.
    """
    check_name(name)
    check_key(key)
    payload = to_json(payload, "An event's payload")
    namespace = namespace_for(backend)
    with using_backend(backend):  # the alias's database, in the caller's transaction there
        return events_store.event_publish(
            name, payload, key=key, namespace=namespace, on_publish=tuple(_publish_hooks)
        )


def subscribe(
    name: str, *, timeout: float, key: str | None = None, backend: str = "default"
) -> Event | None:
    """Wait up to ``timeout`` seconds for the oldest unacked event of ``name`` (and
    ``key``, if given); lease it to the caller and return it, or None at timeout.

    The event comes back to other subscribers if it is not acked within
    ``DISPATCH["EVENT_LEASE_SECONDS"]``: ack it once handled. On PostgreSQL
    (with ``LISTEN`` on) a publish wakes the wait at once; otherwise, and for
    leases that run out, it polls every ``POLL_INTERVAL``. Do not call it
    inside ``transaction.atomic()``: a publish committed meanwhile would not
    be visible to the open transaction on every database.
    """
    check_name(name)
    check_key(key)
    timeout = check_timeout(timeout)
    namespace = namespace_for(backend)
    with using_backend(backend):
        return _subscribe(name, key, timeout, namespace)


def _subscribe(name: str, key: str | None, timeout: float, namespace: str) -> Event | None:
    settings = get_settings()
    deadline = time.monotonic() + timeout

    def lease() -> Event | None:
        return events_store.event_lease(
            name, key=key, namespace=namespace, lease_seconds=settings.EVENT_LEASE_SECONDS
        )

    event = lease()
    if event is not None or timeout == 0:
        return event
    with _wakeups(namespace, settings.LISTEN) as wait:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            wait(min(remaining, settings.POLL_INTERVAL))
            event = lease()
            if event is not None:
                return event


async def asubscribe(
    name: str, *, timeout: float, key: str | None = None, backend: str = "default"
) -> Event | None:
    """``subscribe`` for async code (on a thread of its own, which closes its connection)."""

    def call() -> Event | None:
        try:
            return subscribe(name, timeout=timeout, key=key, backend=backend)
        finally:
            connections.close_all()  # this worker thread's connections only

    return await sync_to_async(call, thread_sensitive=False)()


def ack(event_id: int, *, backend: str = "default") -> bool:
    """Mark an event handled. True only for the call that acked it: False for an
    event already acked, unknown, or of another namespace."""
    if not isinstance(event_id, int) or isinstance(event_id, bool):
        raise ValueError(f"event_id must be the int publish() returned, got {event_id!r}.")
    namespace = namespace_for(backend)
    with using_backend(backend):
        return events_store.event_ack(event_id, namespace=namespace)


@contextlib.contextmanager
def _wakeups(namespace: str, listen: bool) -> Iterator[Any]:
    """A ``wait(seconds)`` that returns early when an event of the namespace is
    published: LISTEN on a connection of its own (PostgreSQL), else a plain sleep."""
    connection = connections[db_alias()]
    conn = None
    if listen and connection.vendor == "postgresql":
        try:
            import psycopg

            from ..runtime.listener import listener_params

            connection.ensure_connection()
            conn = psycopg.connect(**listener_params(connection), autocommit=True)
            conn.execute(f"LISTEN {events_store.event_channel(namespace)}")
        except Exception:  # polling still works
            conn = None
    if conn is None:
        yield threading.Event().wait
        return

    def wait(seconds: float) -> None:
        for _ in conn.notifies(timeout=seconds, stop_after=1):
            break

    try:
        yield wait
    finally:
        conn.close()
