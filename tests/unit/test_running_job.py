"""A running job's stop flag and its lazily made cancel event agree, whichever comes first."""

import threading
from types import SimpleNamespace

from django_dispatch.runtime.running import RunningJob


def _running() -> RunningJob:
    return RunningJob(claimed=SimpleNamespace(id=1), lease_seconds=1.0)  # type: ignore[arg-type]


def test_no_event_is_made_until_asked_for():
    running = _running()
    assert not running.stop_requested
    running.stop()
    assert running.stop_requested
    assert running._cancel_event is None  # stop needs no Event


def test_a_stop_before_the_event_is_made_sets_it():
    running = _running()
    running.stop()
    assert running.cancel_event.is_set()


def test_a_stop_after_the_event_is_made_sets_it():
    running = _running()
    event = running.cancel_event
    assert not event.is_set()
    running.stop()
    assert event.is_set() and running.cancel_event is event


def test_the_event_set_by_a_context_counts_as_a_stop():
    running = _running()
    running.cancel_event.set()  # as a task's context does when its lease is lost
    assert running.stop_requested


def test_one_event_however_many_threads_ask():
    running = _running()
    events: list[threading.Event] = []
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait(timeout=10)
        events.append(running.cancel_event)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)
    assert len(events) == 8 and all(event is events[0] for event in events)
