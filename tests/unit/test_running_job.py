"""A running job's stop flag and its lazily made cancel event agree, whichever comes
first; a job handed back before its code starts never starts it."""

import asyncio
import threading
from types import SimpleNamespace

from django_dispatch.exceptions import JobCancelled
from django_dispatch.runtime import attempt, synchops
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


def test_a_job_handed_back_before_its_code_starts_never_starts_it():
    """A stop marks its jobs abandoned before it asks each to stop: a job
    whose start comes in between must not run its task code."""
    ran: list[int] = []

    async def body() -> None:
        ran.append(1)

    running = RunningJob(claimed=SimpleNamespace(id=1, row={}), lease_seconds=1.0)  # type: ignore[arg-type]
    running.abandoned = True
    assert attempt.prepare(running.claimed, running).kind == "discarded"  # type: ignore[arg-type]
    prepared = SimpleNamespace(timeout=None, task=SimpleNamespace(func=body), args=[], kwargs={})
    for coro in (
        attempt.run_untimed(prepared, running),  # type: ignore[arg-type]
        attempt.run_async(prepared.task, [], {}, 5.0, running),  # type: ignore[arg-type]
    ):
        try:
            asyncio.run(coro)
        except JobCancelled:
            pass
        else:
            raise AssertionError("the task code was allowed to start")
    assert ran == []


def test_a_failed_hop_fails_each_of_its_steps_instead_of_leaving_them_waiting(monkeypatch):
    async def broken(func, *args, **kwargs):
        raise RuntimeError("cannot schedule new futures after shutdown")

    monkeypatch.setattr(synchops, "sync", broken)

    async def main() -> list[BaseException]:
        hops = synchops.SyncHops(asyncio.get_running_loop())
        steps = [hops.run(lambda: 1), hops.run(lambda: 2)]
        results = await asyncio.wait_for(asyncio.gather(*steps, return_exceptions=True), 5)
        return list(results)

    results = asyncio.run(main())
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    assert "the sync hop failed" in str(results[0])
