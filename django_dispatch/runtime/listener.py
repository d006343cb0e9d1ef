"""PostgreSQL LISTEN wake-ups for idle workers, on a connection of its own.

A lost connection (server restart, ``pg_terminate_backend``) is noticed within
one health-check interval and re-established; meanwhile the worker keeps
polling, so a broken listener slows pickup down but never stops it.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from typing import Any

from django.db import connections

from ..conf import DispatchSettings
from ..store import flow, notify_channel
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
        #: ``stop`` writes a byte here: the thread waits on it beside the
        #: connection's socket, so a stopping worker (``--burst``'s end,
        #: SIGTERM) does not wait out a polling interval to join it; waiting
        #: on the socket alone, every stop took up to half a second longer.
        self._stop_read, self._stop_write = os.pipe()
        #: Guards the pipe's end: once the thread closed it, its number may
        #: belong to another file, which ``stop`` must never write to.
        self._pipe_lock = threading.Lock()
        self._pipe_open = True

    def stop(self) -> None:
        self.stopping.set()
        with self._pipe_lock:
            if self._pipe_open:
                os.write(self._stop_write, b"\0")

    def run(self) -> None:
        import psycopg  # only a PostgreSQL worker gets here: psycopg is an extra

        try:
            self._listen(psycopg)
        finally:
            with self._pipe_lock:
                self._pipe_open = False
                os.close(self._stop_read)
                os.close(self._stop_write)

    def _listen(self, psycopg: Any) -> None:
        pause = 0.1
        while not self.stopping.is_set():
            try:
                with (
                    psycopg.connect(**self.conn_params, autocommit=True) as conn,
                    selectors.DefaultSelector() as selector,
                ):
                    conn.execute(f"LISTEN {self.channel}")
                    selector.register(conn.fileno(), selectors.EVENT_READ)
                    selector.register(self._stop_read, selectors.EVENT_READ)
                    self.connected.set()
                    self.wakeup.set()  # something may have arrived while deaf
                    pause = 0.1
                    checked = time.monotonic()
                    while not self.stopping.is_set():
                        due = checked + self.health_interval - time.monotonic()
                        selector.select(max(0.0, due))
                        # Read whatever arrived, without waiting: also the
                        # notifications psycopg buffered during the health
                        # check, which leave the socket with nothing to read.
                        for note in conn.notifies(timeout=0):
                            if note.payload == flow.FLOW_PAYLOAD:
                                flow.forget_paused()  # a queue was paused or resumed
                            self.wakeup.set()
                        if time.monotonic() - checked >= self.health_interval:
                            conn.execute("SELECT 1")  # a silently dead socket raises here
                            checked = time.monotonic()
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
