"""The database work of a block of code, counted: what a test asserts instead of time.

A test that times a drain measures the machine as much as the code: on a
busy 2-core CI machine the same drain varies by a third from one run to the
next. Work does not: a statement that reads every waiting row instead of an
index range costs the same extra on any machine, in proportion to the rows.

* SQLite: virtual machine instructions (``set_progress_handler``), on every
  connection that is open or opened meanwhile, so the worker threads' too.
* PostgreSQL: shared buffers read by every statement of the test database
  (``pg_stat_statements``, which ``scripts/with-postgres`` preloads with room
  for 20,000 statements, so none is evicted mid-count; on a server without it
  the test is skipped, saying so).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.db.backends.signals import connection_created

#: SQLite calls the handler every this many instructions.
_STEP = 10


class Work:
    """How much work the block did, in the database's own unit (see the module docstring)."""

    def __init__(self) -> None:
        self.amount = 0
        self._lock = threading.Lock()

    def add(self, amount: int) -> None:
        with self._lock:
            self.amount += amount


@contextmanager
def database_work() -> Iterator[Work]:
    """Count the database work of the block (see the module docstring)."""
    if connection.vendor == "sqlite":
        with _sqlite_work() as work:
            yield work
    else:
        with _postgres_work() as work:
            yield work


@contextmanager
def _sqlite_work() -> Iterator[Work]:
    work = Work()

    def tick() -> int:
        work.add(_STEP)
        return 0  # go on

    installed: list[Any] = []

    def install(raw: Any) -> None:
        raw.set_progress_handler(tick, _STEP)
        installed.append(raw)

    def on_created(sender: Any, connection: Any, **kwargs: Any) -> None:
        install(connection.connection)

    connection.ensure_connection()
    install(connection.connection)
    connection_created.connect(on_created)
    try:
        yield work
    finally:
        connection_created.disconnect(on_created)
        for raw in installed:  # those still open would go on counting
            with suppress(sqlite3.ProgrammingError):  # closed since
                raw.set_progress_handler(None, _STEP)


_PG_BLOCKS_SQL = """
SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0) FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


@contextmanager
def _postgres_work() -> Iterator[Work]:
    work = Work()
    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            # This database's statements only: other test runs may share the server.
            cursor.execute(
                "SELECT pg_stat_statements_reset(0, oid, 0) FROM pg_database"
                " WHERE datname = current_database()"
            )
    except DatabaseError as error:
        pytest.skip(
            f"counting PostgreSQL's work needs pg_stat_statements ({error}); "
            "add it to the server's shared_preload_libraries, as scripts/with-postgres does"
        )
    yield work
    with connection.cursor() as cursor:
        cursor.execute(_PG_BLOCKS_SQL)
        work.add(int(cursor.fetchone()[0]))


def assert_flat_beside(
    add_rows: Callable[[int], None], measure: Callable[[], int], *, few: int, many: int
) -> None:
    """Assert that ``measure``'s work is about the same beside ``many`` rows as beside
    ``few`` (``add_rows(n)`` adds n more): within 3 times, where reading the rows
    would cost about ``many / few`` times as much."""
    add_rows(few)
    before = measure()
    add_rows(many - few)
    after = measure()
    assert after <= 3 * max(before, 1), f"work beside {few:,} rows: {before}; {many:,}: {after}"
