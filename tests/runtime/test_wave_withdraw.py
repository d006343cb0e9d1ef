"""A waiting success goes to one writer: a completion wave, or the asyncio
watchdog that writes it one by one, never both.

Were both to write it, whichever wrote second would find the job finished
and report it lost, and ``task_finished`` would not be sent. The race is
between the control loop taking a wave and the event loop's watchdog: both
sides are exercised here from two real threads.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from django_dispatch.runtime.completer import BatchCompleter
from django_dispatch.runtime.executor import Outcome
from django_dispatch.runtime.running import RunningJob


def _success(job_id: int) -> RunningJob:
    return RunningJob(claimed=SimpleNamespace(id=job_id), lease_seconds=1.0)  # type: ignore[arg-type]


def test_a_withdrawn_success_is_skipped_by_the_next_wave():
    completer = BatchCompleter(threading.Event(), 1.0)
    jobs = [_success(i) for i in range(3)]
    for running in jobs:
        assert completer.offer(running, Outcome("succeeded", None))
    assert completer.withdraw(jobs[1])
    assert completer.take() == [jobs[0], jobs[2]]


def test_a_success_a_wave_took_cannot_be_withdrawn():
    completer = BatchCompleter(threading.Event(), 1.0)
    running = _success(1)
    completer.offer(running, Outcome("succeeded", None))
    assert completer.take() == [running]
    assert not completer.withdraw(running)


def test_racing_waves_and_withdrawals_give_each_success_one_writer():
    completer = BatchCompleter(threading.Event(), 1.0)
    jobs = [_success(i) for i in range(50_000)]
    for running in jobs:
        completer.offer(running, Outcome("succeeded", None))
    waved: list[RunningJob] = []
    withdrawn: list[RunningJob] = []
    go = threading.Barrier(2)

    def waves() -> None:  # the control loop: from the oldest
        go.wait()
        while batch := completer.take():
            waved.extend(batch)

    def watchdog() -> None:  # from the youngest: the two meet somewhere in between
        go.wait()
        withdrawn.extend(r for r in reversed(jobs) if completer.withdraw(r))

    threads = [threading.Thread(target=waves), threading.Thread(target=watchdog)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert withdrawn and waved  # both sides won some: the race took place
    assert {id(r) for r in waved}.isdisjoint(id(r) for r in withdrawn)
    assert len(waved) + len(withdrawn) == len(jobs)
