"""The ``replica`` tier: reads from a real streaming replica, and back to the primary.

Tests marked ``replica`` run only with ``DISPATCH_TEST_DB=replica`` (``make
test-replica``: ``scripts/with-postgres scripts/with-replica``, with
``--ds=tests.replica.settings``), and every other run leaves them out. The
replica is the one the script started; a test may pause its replay, or stop
it, and the ``replica`` fixture brings it back running and replaying before the
next test.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connections

from django_dispatch.queries import reading
from tests.conftest import TEST_DB, wait_until


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "replica: reads from a real streaming replica (DISPATCH_TEST_DB=replica, "
        "make test-replica; left out of every other run)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tier to its own run, and out of every other."""
    keep, drop = [], []
    for item in items:
        marked = item.get_closest_marker("replica") is not None
        (keep if marked == (TEST_DB == "replica") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


class Replica:
    """The streaming replica ``scripts/with-replica`` started: pause, resume, stop, start."""

    def __init__(self) -> None:
        self.url = os.environ["REPLICA_URL"]
        self.data = Path(os.environ["REPLICA_DATA"])
        self.pg_ctl = Path(os.environ["REPLICA_PG_BIN"]) / "pg_ctl"
        self.log = os.environ["REPLICA_LOG"]
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _pg_ctl(self, *args: str) -> None:
        command = [*self.as_user, str(self.pg_ctl), "-D", str(self.data), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=90)
        if done.returncode:
            raise AssertionError(f"pg_ctl {' '.join(args)} failed:\n{done.stdout}{done.stderr}")

    def running(self) -> bool:
        command = [*self.as_user, str(self.pg_ctl), "-D", str(self.data), "status"]
        return subprocess.run(command, capture_output=True).returncode == 0

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        self._pg_ctl("-l", self.log, "-w", "-t", "60", "start")

    def sql(self, statement: str) -> object:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(statement).fetchone()
            return row[0] if row else None

    def pause(self) -> None:
        """Stop replaying: the replica keeps its state of now while the primary moves on."""
        self.sql("SELECT pg_wal_replay_pause()")
        wait_until(
            lambda: self.sql("SELECT pg_get_wal_replay_pause_state()") == "paused",
            what="replay paused",
        )

    def resume(self) -> None:
        self.sql("SELECT pg_wal_replay_resume()")

    def caught_up(self) -> None:
        """Wait until the replica has replayed everything the primary has flushed."""
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_flush_lsn()::text")
            target = cursor.fetchone()[0]
        wait_until(
            lambda: self.sql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"),
            what=f"the replica replayed up to {target}",
        )


@pytest.fixture
def replica(transactional_db) -> Iterator[Replica]:
    """The replica, running, replaying and caught up, with no verdict on it kept;
    after the test, running and replaying again whatever the test did to it."""
    server = Replica()
    if not server.running():
        server.start()
    server.resume()
    server.caught_up()
    reading.forget()
    yield server
    if not server.running():
        server.start()
    for conn in connections.all():  # a connection to the stopped replica is dead
        conn.close()
    server.resume()
    reading.forget()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            server.caught_up()
            break
        except psycopg.OperationalError:  # still starting
            time.sleep(0.1)
