"""What a committed wave leaves to do, on a thread of its own.

A wave that wrote ``ctx.map`` children's successes (``store.workflows.mapwave``)
leaves their count on the parent step, one statement per set, and, at the
set's last child, its gather (a read of every child's output); a child it did
not write has its success written by the general path. None of it may delay
the control loop, which writes the next wave and starts the jobs this one
claimed: it runs here, in order, after the commit it depends on.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable

from django.db import connections

from .. import store

logger = logging.getLogger("django_dispatch.worker")


class FollowUps:
    """One thread running the actions handed over (``put``), in order."""

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=store.carrying_database(self._loop), name="dispatch-followups", daemon=True
        )
        self.thread.start()

    def put(self, actions: Iterable[Callable[[], None]]) -> None:
        for action in actions:
            self.inbox.put(action)

    def stop(self, timeout: float = 5.0) -> None:
        """Run what is queued, then end (after the worker's last wave)."""
        self.inbox.put(None)
        self.thread.join(timeout)

    def _loop(self) -> None:
        try:
            while (action := self.inbox.get()) is not None:
                run(action)
        finally:
            connections.close_all()


def run(action: Callable[[], None]) -> None:
    """One action; its failure is logged (each leaves its repair to a sweep)."""
    try:
        action()
    except Exception:
        logger.exception("a wave's follow-up failed")
