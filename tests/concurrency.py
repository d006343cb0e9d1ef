"""Races in one test process: threads, each with database connections of its own.

Django gives every thread its own connections, opened on first use; a thread
that ends without closing them leaves them open (on PostgreSQL, a server
session that keeps the test database from being dropped). ``run_concurrently``
is the one way the suite starts such threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections


def run_concurrently(
    *targets: Callable[[], Any], together: bool = False, timeout: float = 60.0
) -> list[Any]:
    """Run each target in its own thread; return their results in target order.

    Each thread closes its connections when its target ends. ``together``:
    the targets start at one barrier, so their first statements race. An
    exception in any target is re-raised here (the first one, by target
    order), after every thread ended; a thread still running after
    ``timeout`` seconds fails the test (a deadlock, or a wait that never ends).
    """
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException | None] = [None] * len(targets)
    barrier = threading.Barrier(len(targets)) if together else None

    def run(index: int, target: Callable[[], Any]) -> None:
        try:
            if barrier is not None:
                barrier.wait(timeout)
            results[index] = target()
        except BaseException as error:  # reported in the calling thread
            errors[index] = error
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=run, args=(index, target), name=f"concurrent-{index}")
        for index, target in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    assert not hung, f"threads {hung} still running after {timeout} s (deadlock?)"
    for error in errors:
        if error is not None:
            raise error
    return results
