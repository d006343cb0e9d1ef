"""Fixtures shared by the suite: real worker subprocesses and polling waits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

# The whole suite runs with a trigger that rejects any job state change not
# listed in states.TRANSITIONS (PostgreSQL): see tests/transitions.py.
from tests.transitions import transition_guard  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
TEST_DB = os.environ.get("DISPATCH_TEST_DB", "postgres")
ON_POSTGRES = TEST_DB != "sqlite"

postgres_only = pytest.mark.skipif(not ON_POSTGRES, reason="needs PostgreSQL")

#: What runs through PgBouncer in transaction mode (DISPATCH_TEST_DB=pgbouncer,
#: `make test-pgbouncer`): whole modules, or single tests as "module::name", each
#: module by its path under tests/ (two layers may have modules of one name).
PGBOUNCER_TIER = {
    "acceptance/test_backend.py",
    "acceptance/test_pgbouncer.py",
    "store/test_partitions.py",
    "store/test_partition_race.py",
    "store/test_scheduler.py",
    "store/test_atomic_finish.py",
    "store/test_wave.py",
    "runtime/test_workflows.py",
    "acceptance/test_processes.py::test_two_processes_four_threads_run_each_job_exactly_once",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the PgBouncer tier and the slow one; keep each run to its tier.

    A test that starts a worker process (the ``start_worker`` fixture) is
    ``slow`` whether or not it says so, so ``make test-fast`` never starts
    one; tests that run other processes (``subprocess``) carry the mark
    themselves.

    ``DISPATCH_TEST_DB=pgbouncer`` runs only the ``pgbouncer`` tier, and
    ``DISPATCH_TEST_DB=chaos`` only the chaos suite (it starts servers of its
    own); every other run leaves the chaos suite out.
    """
    keep, drop = [], []
    for item in items:
        module = item.nodeid.split("::", 1)[0].removeprefix("tests/")
        if module in PGBOUNCER_TIER or f"{module}::{item.originalname}" in PGBOUNCER_TIER:
            item.add_marker(pytest.mark.pgbouncer)
        if "start_worker" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "slow"
        ):
            item.add_marker(pytest.mark.slow)
        if TEST_DB == "chaos":
            wanted = item.get_closest_marker("chaos") is not None
        elif TEST_DB == "pgbouncer":
            wanted = item.get_closest_marker("pgbouncer") is not None
        else:
            wanted = item.get_closest_marker("chaos") is None
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


if TEST_DB == "pgbouncer":

    @pytest.fixture(scope="session")
    def django_db_setup(django_db_setup, django_db_blocker):
        """Let the test database be dropped although PgBouncer pools sessions to it.

        PgBouncer keeps idle server sessions open to every database it served,
        so DROP DATABASE would fail; end them directly on the server first.
        """
        yield
        import psycopg

        name = connection.settings_dict["NAME"]
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as direct:
            direct.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                [name],
            )


def wait_until(condition: Callable[[], object], timeout: float = 20.0, what: str = "") -> object:
    """Poll ``condition`` until it is truthy; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.05)


class WorkerProcess:
    def __init__(self, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.popen = popen
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            raise AssertionError(f"worker did not exit in {timeout} s:\n{self.output()}") from None

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def wait_for_output(self, text: str, timeout: float = 10.0) -> None:
        """Wait for ``text`` in a running worker's log. A worker logs after
        its write commits, so a test that sees the write first can read
        the log a moment before the line is there."""
        wait_until(lambda: text in self.output(), timeout=timeout, what=f"{text!r} in the log")

    def kill_group(self) -> None:
        """SIGKILL the worker and every process it forked (its own process
        group): a ``--processes`` child must not outlive its test, claiming
        the next tests' jobs."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


@pytest.fixture
def start_worker(transactional_db, tmp_path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``manage.py rundispatch`` as a real process on the test database."""
    started: list[WorkerProcess] = []

    def start(
        *args: str,
        overrides: dict | None = None,
        db_name: str | None = None,
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        """``env`` adds to the worker's environment (e.g. another DATABASE_URL)."""
        connection.ensure_connection()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DISPATCH_DB_NAME": db_name or str(connection.settings_dict["NAME"]),
            "DISPATCH_OVERRIDES": json.dumps(overrides or {}),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        log = tmp_path / f"worker-{len(started)}.log"
        popen = subprocess.Popen(
            [sys.executable, "-m", "django", "rundispatch", *args],
            cwd=ROOT,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a group of its own: see WorkerProcess.kill_group
        )
        worker = WorkerProcess(popen, log)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill_group()


@pytest.fixture
def login(client, django_user_model) -> Callable[..., object]:
    """``login(*codenames, superuser=False, staff=True, name=None)``: create a user
    holding exactly those ``django_dispatch`` permissions (or a superuser), log
    the test client in as that user, and return it. Each call makes a new user."""
    from django.contrib.auth.models import Permission

    made = 0

    def make(
        *codenames: str, superuser: bool = False, staff: bool = True, name: str | None = None
    ) -> object:
        nonlocal made
        made += 1
        name = name or f"op{made}"
        if superuser:
            user = django_user_model.objects.create_superuser(name, f"{name}@x.test", "pw")
        else:
            user = django_user_model.objects.create_user(name, is_staff=staff)
            user.user_permissions.set(
                Permission.objects.filter(
                    content_type__app_label="django_dispatch", codename__in=codenames
                )
            )
        client.force_login(user)
        return user

    return make
