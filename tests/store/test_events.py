"""Events: publish / subscribe / ack on the real database (PostgreSQL and SQLite)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.db import transaction
from django.test import override_settings

from django_dispatch import events
from django_dispatch.exceptions import InvalidTaskArguments
from django_dispatch.models import Event
from django_dispatch.store import events as events_store
from tests.concurrency import run_concurrently
from tests.conftest import postgres_only

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_dispatch.backend.DispatchBackend"
TASKS_OTHER = {
    "default": {"BACKEND": BACKEND, "QUEUES": [], "OPTIONS": {}},
    "other": {"BACKEND": BACKEND, "QUEUES": [], "OPTIONS": {"NAMESPACE": "other"}},
}


def test_publish_subscribe_ack_round_trip():
    event_id = events.publish("order.paid", {"amount": 42}, key="order:1")
    event = events.subscribe("order.paid", timeout=1)
    assert event is not None
    assert (event.id, event.name, event.key, event.payload) == (
        event_id,
        "order.paid",
        "order:1",
        {"amount": 42},
    )
    assert event.published_at is not None and event.acked_at is None
    assert events.ack(event_id) is True
    assert events.ack(event_id) is False  # a double ack: only the first call acked it
    assert events.ack(987654321) is False  # unknown
    assert Event.objects.get(id=event_id).acked_at is not None
    assert events.subscribe("order.paid", timeout=0) is None  # acked: never again


def test_subscribe_times_out_with_none():
    events.publish("other.name")
    started = time.monotonic()
    assert events.subscribe("order.paid", timeout=0.3) is None
    assert time.monotonic() - started >= 0.3


def test_oldest_first_and_key_filter():
    first = events.publish("e", 1, key="a")
    second = events.publish("e", 2, key="b")
    keyed = events.subscribe("e", timeout=0, key="b")
    assert keyed is not None and keyed.id == second
    any_key = events.subscribe("e", timeout=0)
    assert any_key is not None and any_key.id == first
    assert events.subscribe("e", timeout=0) is None  # both leased


def test_two_subscribers_race_for_one_event_exactly_one_gets_it():
    events.publish("race", {"n": 1})

    def take():
        return events.subscribe("race", timeout=0.5)

    for _ in range(5):  # several rounds of a real race, each on fresh connections
        results = run_concurrently(take, take, take, together=True)
        got = [r for r in results if r is not None]
        assert len(got) <= 1
        if got:
            assert events.ack(got[0].id) is True
            events.publish("race", {"n": 1})
    assert Event.objects.filter(name="race", acked_at__isnull=False).count() >= 1


def test_many_subscribers_each_event_delivered_once():
    ids = {events.publish("fanout", i) for i in range(20)}

    def drain_some():
        got = []
        while (event := events.subscribe("fanout", timeout=0)) is not None:
            got.append(event.id)
            assert events.ack(event.id)
        return got

    results = run_concurrently(*[drain_some] * 4, together=True)
    delivered = [event_id for got in results for event_id in got]
    assert sorted(delivered) == sorted(ids)  # every event once, none twice


@override_settings(DISPATCH={"EVENT_LEASE_SECONDS": 0.5, "POLL_INTERVAL": 0.05})
def test_an_unacked_event_is_redelivered_after_its_lease():
    event_id = events.publish("lease")
    first = events.subscribe("lease", timeout=0)
    assert first is not None and first.deliveries == 1
    assert events.subscribe("lease", timeout=0) is None  # leased to the first caller
    again = events.subscribe("lease", timeout=5)
    assert again is not None and again.id == event_id and again.deliveries == 2
    assert events.ack(event_id) is True


def test_published_in_a_rolled_back_transaction_never_existed():
    with pytest.raises(RuntimeError), transaction.atomic():
        events.publish("rolled.back", {"x": 1})
        raise RuntimeError("abort")
    assert not Event.objects.exists()
    assert events.subscribe("rolled.back", timeout=0) is None


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: events.publish(""), ValueError, "non-empty string"),
        (lambda: events.publish("x" * 201), ValueError, "at most 200"),
        (lambda: events.publish(None), ValueError, "event name"),
        (lambda: events.publish("n", key=""), ValueError, "event key"),
        (lambda: events.publish("n", key="k" * 256), ValueError, "at most 255"),
        (lambda: events.publish("n", object()), InvalidTaskArguments, "payload"),
        (lambda: events.publish("n", float("nan")), InvalidTaskArguments, "payload"),
        (lambda: events.subscribe("n", timeout=-1), ValueError, "zero or more"),
        (lambda: events.subscribe("n", timeout="1"), ValueError, "number of seconds"),
        (lambda: events.subscribe("", timeout=1), ValueError, "event name"),
        (lambda: events.ack("1"), ValueError, "event_id"),
        (lambda: events.publish("n", backend="nope"), ValueError, "no DispatchBackend alias"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert not Event.objects.exists()


@override_settings(TASKS=TASKS_OTHER)
def test_namespaces_never_see_each_others_events():
    mine = events.publish("ns.event", 1)
    theirs = events.publish("ns.event", 2, backend="other")
    assert events.ack(theirs) is False  # a foreign-namespace ack
    assert events.ack(mine, backend="other") is False
    got = events.subscribe("ns.event", timeout=0, backend="other")
    assert got is not None and got.id == theirs and got.namespace == "other"
    assert events.ack(theirs, backend="other") is True
    got = events.subscribe("ns.event", timeout=0)
    assert got is not None and got.id == mine


def test_asubscribe():
    event_id = events.publish("async.event", {"ok": True})

    async def main():
        return await events.asubscribe("async.event", timeout=1)

    event = asyncio.run(main())
    assert event is not None and event.id == event_id and event.payload == {"ok": True}


@override_settings(DISPATCH={"POLL_INTERVAL": 0.05})
def test_a_waiting_subscriber_gets_an_event_published_later():
    box = {}

    def later():
        time.sleep(0.3)
        box["id"] = events.publish("later", "hello")

    results = run_concurrently(lambda: events.subscribe("later", timeout=10), later)
    assert results[0] is not None and results[0].id == box["id"]


@postgres_only
@override_settings(DISPATCH={"POLL_INTERVAL": 60.0})
def test_listen_wakes_a_waiting_subscriber_without_a_poll():
    """With a poll interval far beyond the timeout, only the NOTIFY can deliver in time."""
    ready = threading.Event()

    def later():
        ready.wait(5)
        time.sleep(0.3)  # the subscriber is listening by now
        return events.publish("notified", 1)

    def wait():
        ready.set()
        return events.subscribe("notified", timeout=5)

    got, published = run_concurrently(wait, later)
    assert got is not None and got.id == published


def test_purge_deletes_acked_events_past_retention_only():
    old = events.publish("p", 1)
    kept_unacked = events.publish("p", 2)
    assert events.ack(old)
    time.sleep(0.5)
    fresh = events.publish("p", 3)
    assert events.ack(fresh)
    deleted = events_store.events_purge(0.4, batch=1, max_seconds=5)
    assert deleted == 1
    assert set(Event.objects.values_list("id", flat=True)) == {kept_unacked, fresh}
