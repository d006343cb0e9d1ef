"""Database connections of a worker: a connection a fault broke never reaches task code.

A job thread keeps its connection from one job to the next (a connect per job
would cost more than a no-op job). A connection can break while it sits idle:
the server restarted or failed over, PgBouncer restarted, a firewall dropped
an idle socket. The client learns it only at its next query, and without the
check below that query is the task's own: the attempt fails with
``OperationalError`` through no fault of the job.

So before each attempt a job thread checks its connections when there is a
reason to doubt them, as Django does for a request with
``CONN_HEALTH_CHECKS``, but without a round trip per job on a busy worker:

- the thread was idle longer than ``IDLE_CHECK_SECONDS`` (a busy thread's
  connection was used successfully an instant ago);
- an error occurred on the connection;
- another part of this process saw the database go away since the thread
  last checked (the *generation*, bumped by the control loop, the listener
  and the completer whenever a database error reaches them);
- the database's ``CONN_HEALTH_CHECKS`` is True: the site asked for a check
  before every unit of work, and pays its round trip.

The check is Django's own ``is_usable()``. A connection that fails it is
closed and opened again at once, so a database that is still down shows up
*before* task code, where the job is handed back without spending an attempt
(see ``jobthreads.JobRunner.begin``). ``CONN_MAX_AGE`` is honoured as a maximum
age between jobs when it is a positive number; ``0`` (Django's default, "close
after each request") and ``None`` keep the connection, since a worker's unit
of work is not a request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django_dispatch.worker")

#: A job thread idle longer than this checks its connection before its next job.
IDLE_CHECK_SECONDS = 1.0

_lock = threading.Lock()
_generation = 0


def generation() -> int:
    return _generation


def database_went_away() -> None:
    """Record that this process saw the database fail: every job thread rechecks."""
    global _generation
    with _lock:
        _generation += 1


#: Tries of a statement ``ride_out`` repeats against database errors,
#: ``RIDE_OUT_PAUSE`` seconds apart: past them, the database is taken to be
#: down, and the error is raised.
RIDE_OUT_TRIES = 20
RIDE_OUT_PAUSE = 0.5


def ride_out[T](step: Callable[[], T], *, while_: str) -> T:
    """``step``, tried again after a database error, outside the control loop.

    For what runs before the loop, or between a drain's workers: a cut there (a
    failover, a pooler's restart) is ridden out as the loop rides it out, by
    closing this thread's broken connections and trying again. ``step`` must
    be safe to repeat: a write whose reply was lost is found done by the next
    try. ``while_`` says when, in the warning ("as the worker starts").
    """
    for _ in range(RIDE_OUT_TRIES - 1):
        try:
            return step()
        except (DatabaseError, InterfaceError):
            logger.warning("a database error %s; will retry", while_, exc_info=True)
            for conn in connections.all(initialized_only=True):
                conn.close()
            time.sleep(RIDE_OUT_PAUSE)
    return step()


def recover_after_error() -> None:
    """After a database error on this thread: drop its broken connections, warn the others.

    The control loop, the listener and the completer call this, so that one
    reconnect path serves them all: the next query on this thread opens a new
    connection, and the job threads check theirs before their next attempt.
    """
    database_went_away()
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()


#: SQLSTATEs of a lost connection rather than a failed statement: class 08
#: (connection exception), 57P01 admin_shutdown, 57P02 crash_shutdown,
#: 57P03 cannot_connect_now (the server is starting or stopping).
_CONNECTION_SQLSTATES = ("08", "57P01", "57P02", "57P03")


#: A deadlock, or a serialization failure: in an atomic group, what a member's
#: locks, held past its body, can cause another member (``atomic_group``).
_CONTENTION_SQLSTATES = ("40P01", "40001")


def contention(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps) is a deadlock or a serialization failure."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if str(getattr(current, "sqlstate", "") or "") in _CONTENTION_SQLSTATES:
            return True
        current = current.__cause__ or current.__context__
    return False


def lost_connection(exception: BaseException) -> bool:
    """Whether ``exception`` failed because the database connection was lost.

    Walks the exception's chain (Django wraps the driver's error; a task may
    wrap Django's). A lost connection is: Django's ``InterfaceError``
    (connection already closed); a driver error whose SQLSTATE is a
    connection one; a driver ``OperationalError`` with no SQLSTATE at all
    (the socket closed before the server answered); or any database error
    while a connection of this thread is now broken. The error is read, not
    only the connection: Django's ``atomic`` drops a connection whose
    rollback failed and a task may reconnect, so after a loss inside
    ``atomic`` the thread's connection may look fine, or be a new one. An
    error the task's own SQL caused (a missing table, a constraint, a
    statement timeout) has a statement SQLSTATE and a working connection.
    """
    seen: set[int] = set()
    error: BaseException | None = exception
    database_error = False
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, InterfaceError):
            return True
        if isinstance(error, DatabaseError):
            database_error = True
        if _driver_says_connection_lost(error):
            return True
        error = error.__cause__ or error.__context__
    return database_error and connection_broke()


def _driver_says_connection_lost(error: BaseException) -> bool:
    if not type(error).__module__.startswith("psycopg"):
        return False
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate is None:
        return any(cls.__name__ == "OperationalError" for cls in type(error).__mro__)
    return str(sqlstate).startswith(_CONNECTION_SQLSTATES)


def connection_broke() -> bool:
    """Whether a connection of this thread was cut under it (no I/O: psycopg's flag).

    True after the server closed the socket, a failover, ``pg_terminate_backend``:
    what a restart does to a task's queries, as opposed to an error the task's
    own SQL caused on a connection that still works.
    """
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is not None and (getattr(raw, "broken", False) or getattr(raw, "closed", False)):
            return True
    return False


class ThreadConnections:
    """What one job thread knows about its connections: when they were last proven good.

    ``exclusive``: nothing but this thread's own jobs runs on it (a job
    thread of ``JobThreads``), so the reset that ends a job (``end_job``)
    also proves the connections for the next one: while no error, database
    failure or idle spell came between, ``ready_for_task`` then skips its
    scan of the thread's connections (asgiref lookups, a measurable share of
    a short job's CPU) and finds them as the reset left them. Not for a
    thread that runs other code between jobs (the asyncio executor's sync
    thread runs tasks' database calls there).
    """

    def __init__(self, *, exclusive: bool = False) -> None:
        self.seen_generation = _generation
        self.last_used = time.monotonic()
        self.exclusive = exclusive
        #: The alias whose connection the last ``end_job`` left open, every
        #: connection of the thread clean (no error, no transaction open, no
        #: health checks or maximum age asked for): no check is due before the
        #: next job but the doubts of ``ready_for_task``. None: scan first.
        self.proven: str | None = None

    def ready_for_task(self, db: str) -> None:
        """Make this thread's connections usable before task code runs.

        Raises ``DatabaseError`` when the database cannot be reached: the
        caller hands the job back, no attempt spent.
        """
        now = time.monotonic()
        doubt = self.seen_generation != _generation or now - self.last_used > IDLE_CHECK_SECONDS
        proven, self.proven = self.proven, None
        if proven == db and not doubt:
            return  # as the reset after the last job left them: nothing would be checked
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None and _should_check(conn, doubt, now):
                if not conn.is_usable():
                    conn.close()
                else:
                    conn.errors_occurred = False
        connections[db].ensure_connection()
        self.seen_generation = _generation

    def done(self) -> None:
        self.last_used = time.monotonic()
        self.proven = None

    def end_job(self, db: str) -> None:
        """After a job on this thread: ``reset_connections``, and ``done``.

        On an ``exclusive`` thread, remembers whether the reset left ``db``'s
        connection open and nothing that ``ready_for_task`` would check.
        """
        clean = reset_connections(db)
        self.done()
        if self.exclusive and clean:
            self.proven = db


def reset_connections(db: str | None = None) -> bool:
    """Keep a thread's connections across jobs unless a task broke them.

    True when ``db``'s connection is open and every connection is as a next
    job may find it without a check: nothing went wrong on it, and its
    database asks for neither health checks nor a maximum age.
    """
    clean, open_db = True, False
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            logger.error("a task left a transaction open; rolling it back")
            conn.close()
            clean = False
        elif conn.errors_occurred:
            if not conn.is_usable():
                conn.close()
            else:
                conn.errors_occurred = False
            clean = False  # the next job checks once more
        else:
            settings = conn.settings_dict
            if settings.get("CONN_HEALTH_CHECKS") or settings.get("CONN_MAX_AGE"):
                clean = False
            if conn.alias == db and conn.connection is not None:
                open_db = True
    return clean and open_db


def _should_check(conn: BaseDatabaseWrapper, doubt: bool, now: float) -> bool:
    max_age = conn.settings_dict.get("CONN_MAX_AGE")
    if max_age and conn.close_at is not None and now >= conn.close_at:
        conn.close()  # too old: ``ensure_connection`` opens a fresh one
        return False
    return doubt or conn.errors_occurred or bool(conn.settings_dict.get("CONN_HEALTH_CHECKS"))
