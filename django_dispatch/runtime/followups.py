"""What a committed wave leaves to do, on a thread of its own.

A wave that wrote ``ctx.map`` children's successes (``store.workflows.mapwave``)
leaves their count on the parent step, one statement per set, and, at the
set's last child, its gather (a read of every child's output); a child it did
not write has its success written by the general path. None of it may delay
the control loop, which writes the next wave and starts the jobs this one
claimed: it runs here, in order, after the commit it depends on.

The thread keeps its connection between waves, which may be hours apart for
a worker that runs a map now and then: a connection dropped meanwhile (a
server restart, PgBouncer, a firewall's idle timeout) is found by Django's
``is_usable()`` before the next action, as a job thread finds its own
(``connections.ThreadConnections``), and one that breaks under an action is
closed and the action tried once more on a new one. Otherwise every later
set of this worker would wait for the leader's stale-map sweep.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable

from django.db import DatabaseError, InterfaceError, connections

from .. import store
from .connections import ThreadConnections, lost_connection, recover_after_error

logger = logging.getLogger("django_dispatch.worker")


class FollowUps:
    """One thread running the actions handed over (``put``), in order."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=store.carrying_database(self._loop), name="dispatch-followups", daemon=True
        )
        self.thread.start()

    def put(self, actions: Iterable[Callable[[], None]]) -> None:
        for action in actions:
            self.inbox.put(action)

    def stop(self, timeout: float = 5.0) -> None:
        """Run what is queued, then end (after the worker's last wave).

        What is still queued after ``timeout`` is left to the leader's
        stale-map sweep, which counts a set from its children's rows.
        """
        self.inbox.put(None)
        self.thread.join(timeout)
        if self.thread.is_alive():
            logger.warning(
                "%d follow-ups of the last waves (map counts) not done in %.0f s; "
                "the leader's stale-map sweep counts those sets",
                self.inbox.qsize(),
                timeout,
            )

    def _loop(self) -> None:
        conns = ThreadConnections()
        try:
            while (action := self.inbox.get()) is not None:
                try:
                    conns.ready_for_task(self.db)
                except DatabaseError:  # down: the action fails below and is logged
                    recover_after_error()
                run(action)
                conns.done()
        finally:
            connections.close_all()


def run(action: Callable[[], None]) -> None:
    """One action, tried again once on a new connection if its connection
    was lost; a failure is logged (each leaves its repair to a sweep)."""
    for last in (False, True):
        try:
            action()
            return
        except Exception as e:
            if isinstance(e, DatabaseError | InterfaceError):
                recover_after_error()
            if last or not lost_connection(e):
                logger.exception("a wave's follow-up failed; the stale-map sweep repairs it")
                return
