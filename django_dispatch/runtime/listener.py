"""PostgreSQL LISTEN wake-ups for idle workers, on a connection of its own.

A lost connection (server restart, ``pg_terminate_backend``) is noticed within
one health-check interval and re-established; meanwhile the worker keeps
polling, so a broken listener slows pickup down but never stops it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from typing import Any

from django.db import connections

from ..conf import DispatchSettings
from ..store import flow, notify_channel
from . import flow_cache
from .connections import database_went_away

logger = logging.getLogger("django_dispatch.worker")


class Listener(threading.Thread):
    def __init__(
        self,
        conn_params: dict[str, Any],
        wakeup: threading.Event,
        health_interval: float,
        namespace: str = "",
    ) -> None:
        super().__init__(name="dispatch-listener", daemon=True)
        self.conn_params = conn_params
        #: Only this namespace's channel: another namespace's jobs never wake us.
        self.channel = notify_channel(namespace)
        self.wakeup = wakeup
        self.health_interval = health_interval
        self.stopping = threading.Event()
        self.connected = threading.Event()
        #: ``stop`` writes a byte to this pipe: the thread waits on it beside
        #: the connection's socket, so a stopping worker (``--burst``'s end,
        #: SIGTERM) does not wait out a polling interval to join it; waiting
        #: on the socket alone, every stop took up to half a second longer.
        #: Opened by the thread and closed when it ends, under the lock: once
        #: closed, the descriptors' numbers may belong to other files, which
        #: ``stop`` must never write to.
        self._stop_pipe: tuple[int, int] | None = None
        self._pipe_lock = threading.Lock()

    def stop(self) -> None:
        self.stopping.set()  # before the write: the thread checks it after waking
        with self._pipe_lock:
            if self._stop_pipe is not None:
                with contextlib.suppress(BlockingIOError):  # full: it wakes anyway
                    os.write(self._stop_pipe[1], b"\0")

    def run(self) -> None:
        with self._pipe_lock:
            self._stop_pipe = os.pipe()
            os.set_blocking(self._stop_pipe[1], False)
        try:
            import psycopg  # only a PostgreSQL worker gets here: psycopg is an extra

            self._listen(psycopg, self._stop_pipe[0])
        finally:
            with self._pipe_lock:
                for fd in self._stop_pipe:
                    os.close(fd)
                self._stop_pipe = None

    def _listen(self, psycopg: Any, stop_read: int) -> None:
        pause = 0.1
        while not self.stopping.is_set():
            try:
                with (
                    psycopg.connect(**self.conn_params, autocommit=True) as conn,
                    selectors.DefaultSelector() as selector,
                ):
                    conn.execute(f"LISTEN {self.channel}")
                    selector.register(conn.fileno(), selectors.EVENT_READ)
                    selector.register(stop_read, selectors.EVENT_READ)
                    self.connected.set()
                    self.wakeup.set()  # something may have arrived while deaf
                    pause = 0.1
                    checked = time.monotonic()
                    while not self.stopping.is_set():
                        due = checked + self.health_interval - time.monotonic()
                        selector.select(max(0.0, due))
                        if time.monotonic() - checked >= self.health_interval:
                            conn.execute("SELECT 1")  # a silently dead socket raises here
                            checked = time.monotonic()
                        # Read whatever arrived, without waiting: also what
                        # psycopg set aside while the health check ran, which
                        # left the socket with nothing to read (so it comes
                        # after the check, not before it).
                        for note in conn.notifies(timeout=0):
                            if note.payload == flow.FLOW_PAYLOAD:
                                flow_cache.forget_paused()  # a queue was paused or resumed
                            self.wakeup.set()
            except Exception:
                if self.stopping.is_set():
                    break
                logger.warning("LISTEN connection lost; polling until it is back", exc_info=True)
                database_went_away()  # the job threads' connections may be broken too
            self.connected.clear()
            self.stopping.wait(pause)
            pause = min(pause * 2, 5.0)


def listener_params(connection: Any) -> dict[str, Any]:
    """psycopg connect() arguments for the database behind a Django connection."""
    params = dict(connection.get_connection_params())
    # prepare_threshold stays as Django set it (None: no prepared statements,
    # which a pooler in transaction mode cannot track).
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    return params


def start_listener(
    db: str, settings: DispatchSettings, wakeup: threading.Event, *, namespace: str = ""
) -> Listener | None:
    """Start the LISTEN thread for ``namespace``'s channel on the database ``db``, where it
    applies (PostgreSQL, LISTEN on)."""
    connection = connections[db]
    if not settings.LISTEN or connection.vendor != "postgresql":
        return None
    connection.ensure_connection()
    listener = Listener(
        listener_params(connection),
        wakeup,
        health_interval=settings.HEARTBEAT_INTERVAL,
        namespace=namespace,
    )
    listener.start()
    return listener
