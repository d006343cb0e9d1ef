"""Fixtures of the chaos suite: its own servers, real workers, and the invariants.

The test process's database connection is pointed at the suite's own
PostgreSQL (``django_db_modify_db_settings``), so pytest-django creates the
test database there and the ORM reads the outcome from it; workers get the
same server (directly, or through the suite's PgBouncer) in their
environment.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, connections

from django_dispatch import enqueue_many
from django_dispatch.core.states import TERMINAL, JobState
from django_dispatch.models import DeadLetter, Job
from tests.chaos.servers import PgBouncer, PostgresServer
from tests.conftest import WorkerProcess
from tests.testapp import chaos_tasks
from tests.testapp.models import SideEffect

#: Faults per scenario, and the load scales with it: 1 for the bounded run in
#: `make test`, more with `make test-chaos` (CHAOS_ROUNDS=3 by default there).
ROUNDS = max(1, int(os.environ.get("CHAOS_ROUNDS", "1")))
#: Seed of the random choices (which worker, when); printed by each test.
SEED = int(os.environ.get("CHAOS_SEED", str(int(time.time()))))

#: What every chaos worker runs with on top of tests/settings.py (2 s leases,
#: 0.1 s polls): a job may lose several workers in a row to the kills.
WORKER_OVERRIDES = {"MAX_WORKER_LOST": 10}
#: Markers of a worker bug in a worker's log (as opposed to database faults,
#: which are logged as warnings and retried).
WORKER_BUGS = (
    "job thread crashed",
    "unexpected error in the worker",
    "error in the worker loop; carrying on",
)


@pytest.fixture(scope="session")
def chaos_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def chaos_bouncer(chaos_server: PostgresServer) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(chaos_server)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.destroy()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(chaos_server: PostgresServer) -> None:
    """Create the test database on the chaos server, and read from it."""
    for settings_dict in (settings.DATABASES["default"], connections["default"].settings_dict):
        settings_dict.update(HOST="127.0.0.1", PORT=str(chaos_server.port), NAME="postgres")


def retry_db(step: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Run ``step`` in the test process, reconnecting while the server comes back."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return step()
        except (OperationalError, InterfaceError):
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass
class Outcome:
    """What the invariants found, for the test's own assertions and the log."""

    jobs: dict[int, dict[str, Any]]
    runs: dict[int, list[int]]  # job id -> pid of each "run" side effect
    finished: dict[int, list[int]]  # job id -> pid of each "finished" row
    duplicates: int = 0
    lost_attempts: int = 0
    states: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        return (
            f"{len(self.jobs)} jobs {dict(self.states)}, {self.duplicates} duplicate side "
            f"effects, {self.lost_attempts} attempts lost to faults"
        )


class Chaos:
    """One scenario: its workers, its load, its faults, and the checks at the end."""

    def __init__(self, server: PostgresServer, bouncer: PgBouncer, start_worker) -> None:
        self.server = server
        self.bouncer = bouncer
        self._start_worker = start_worker
        self.workers: list[WorkerProcess] = []
        self.retired: list[WorkerProcess] = []  # killed by the test, on purpose
        self.killed_pids: set[int] = set()
        self.rng = random.Random(SEED)

    # --- workers -----------------------------------------------------------

    def start_worker(
        self, *, via: str = "postgres", concurrency: int = 4, overrides: dict | None = None
    ) -> WorkerProcess:
        """A real ``rundispatch`` on the chaos server; ``via="pgbouncer"``: LISTEN off."""
        db_name = str(connection.settings_dict["NAME"])
        if via == "pgbouncer":
            env = {"DISPATCH_TEST_DB": "pgbouncer", "PGBOUNCER_URL": self.bouncer.url()}
        else:
            env = {"DISPATCH_TEST_DB": "postgres", "DATABASE_URL": self.server.url()}
        worker = self._start_worker(
            "--concurrency",
            str(concurrency),
            overrides={**WORKER_OVERRIDES, **(overrides or {})},
            db_name=db_name,
            env=env,
        )
        self.workers.append(worker)
        return worker

    def start_workers(self, count: int = 3, **options: Any) -> list[WorkerProcess]:
        workers = [self.start_worker(**options) for _ in range(count)]
        self.wait_registered(len(self.workers))
        return workers

    def wait_registered(self, count: int, timeout: float = 30.0) -> None:
        from django_dispatch.models import Worker

        try:
            self.wait(
                lambda: Worker.objects.count() >= count,
                timeout,
                f"{count} workers to register",
            )
        except AssertionError as e:
            logs = "\n".join(f"--- {w.pid}\n{w.output()[-3000:]}" for w in self.workers)
            raise AssertionError(f"{e}\n{logs}") from None

    def kill(self, worker: WorkerProcess) -> None:
        worker.signal(signal.SIGKILL)
        worker.popen.wait(10)
        self.killed_pids.add(worker.pid)
        self.workers.remove(worker)
        self.retired.append(worker)

    def assert_fault_seen(self) -> None:
        """The fault reached the workers (a test whose fault missed proves nothing)."""
        logs = [w.output() for w in self.workers + self.retired]
        assert any("OperationalError" in log for log in logs), (
            "no worker saw a database error:\n" + "\n".join(log[-2000:] for log in logs)
        )

    def stop_workers(self) -> None:
        """No worker died: each is alive, then stops cleanly on SIGTERM with exit 0."""
        for worker in self.workers:
            assert worker.popen.poll() is None, f"worker {worker.pid} died:\n{worker.output()}"
        for worker in self.workers:
            # One restarted a moment ago may still be starting Django, before its handlers
            # exist: SIGTERM's default action would end it (-15) with nothing claimed.
            self.wait(lambda w=worker: " started: queues=" in w.output(), 60, "it to start")
            worker.signal(signal.SIGTERM)
        for worker in self.workers:
            assert worker.wait(60) == 0, worker.output()
        for worker in self.workers + self.retired:
            log = worker.output()
            for bug in WORKER_BUGS:
                assert bug not in log, f"worker {worker.pid} logged {bug!r}:\n{log}"

    # --- load --------------------------------------------------------------

    def enqueue(
        self,
        count: int,
        prefix: str,
        seconds: tuple[float, float] = (0.02, 0.1),
        task: Any = chaos_tasks.work,
    ) -> list[int]:
        calls = [
            ((f"{prefix}-{i}", round(self.rng.uniform(*seconds), 3)), {}) for i in range(count)
        ]
        return [int(job_id) for job_id in retry_db(lambda: enqueue_many(task, calls))]

    @staticmethod
    def wait(condition: Callable[[], object], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = retry_db(condition, timeout=max(1.0, deadline - time.monotonic()))
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.1)

    def succeeded(self, ids: list[int]) -> int:
        return retry_db(lambda: Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count())

    def wait_progress(self, ids: list[int], done: int, timeout: float = 60.0) -> None:
        self.wait(lambda: self.succeeded(ids) >= done, timeout, f"{done} jobs to succeed")

    def wait_finished(self, ids: list[int], timeout: float = 120.0) -> None:
        def unfinished() -> int:
            return Job.objects.filter(pk__in=ids).exclude(state__in=TERMINAL).count()

        try:
            self.wait(lambda: unfinished() == 0, timeout, "every job to finish")
        except AssertionError:
            left = retry_db(
                lambda: list(
                    Job.objects.filter(pk__in=ids)
                    .exclude(state__in=TERMINAL)
                    .values("id", "state", "worker_id", "lease_expires_at")[:10]
                )
            )
            logs = "\n".join(w.output()[-3000:] for w in self.workers)
            raise AssertionError(f"jobs left unfinished: {left}\n{logs}") from None

    # --- faults ------------------------------------------------------------

    def crash_postgres(self, down_for: float = 1.0) -> None:
        """``pg_ctl -m immediate stop``, a pause, and a start on the same port."""
        self.server.crash()
        time.sleep(down_for)
        self.server.start()
        connection.close()

    def restart_pgbouncer(self, down_for: float = 0.5) -> None:
        self.bouncer.stop()
        time.sleep(down_for)
        self.bouncer.start()

    # --- the invariants ------------------------------------------------------

    def check(
        self,
        ids: list[int],
        *,
        faulted_pids: set[int] | None = None,
        expect: JobState = JobState.SUCCEEDED,
    ) -> Outcome:
        """Nothing lost, nothing finished twice, every job finished; duplicates explained.

        A job's side effect may repeat only for an attempt a fault cut short
        and the system recorded as such (``worker_lost_count``, or a spent
        attempt). With ``faulted_pids`` (killed or frozen workers), every run
        but the winning one must also have been on one of those workers:
        a healthy worker never runs a job twice.
        """
        connection.close()
        rows = retry_db(
            lambda: {
                row["id"]: row
                for row in Job.objects.filter(pk__in=ids).values(
                    "id", "state", "attempts", "worker_lost_count", "errors", "worker_ids"
                )
            }
        )
        effects = retry_db(
            lambda: list(
                SideEffect.objects.filter(job_id__in=[str(i) for i in ids]).values_list(
                    "job_id", "note", "worker_pid"
                )
            )
        )
        runs: dict[int, list[int]] = defaultdict(list)
        finished: dict[int, list[int]] = defaultdict(list)
        for job_id, note, pid in effects:
            (runs if note == "run" else finished)[int(job_id)].append(pid)
        outcome = Outcome(jobs=rows, runs=runs, finished=finished)

        missing = set(ids) - set(rows)
        assert not missing, f"jobs lost: {sorted(missing)[:20]}"
        problems: list[str] = []
        for job_id, job in rows.items():
            outcome.states[job["state"]] += 1
            outcome.lost_attempts += job["worker_lost_count"]
            if job["state"] not in TERMINAL:
                problems.append(f"job {job_id} not finished: {job['state']}")
                continue
            if job["state"] != expect:
                errors = [e.get("message", "")[:200] for e in job["errors"]]
                problems.append(f"job {job_id} {job['state']} (expected {expect}): {errors}")
            if len(finished[job_id]) > 1:
                problems.append(f"job {job_id} finished twice, by pids {finished[job_id]}")
            job_runs = runs[job_id]
            if not job_runs:
                problems.append(f"job {job_id} {job['state']} without ever running")
                continue
            extra = len(job_runs) - 1
            outcome.duplicates += extra
            explained = job["worker_lost_count"] + job["attempts"] - 1
            if extra > explained:
                problems.append(
                    f"job {job_id} ran {len(job_runs)} times (pids {job_runs}) but only "
                    f"{explained} lost or failed attempts were recorded"
                )
            if faulted_pids is not None and extra:
                healthy = [pid for pid in job_runs if pid not in faulted_pids]
                if len(healthy) > 1:
                    problems.append(
                        f"job {job_id} ran on healthy workers {healthy} more than once "
                        f"(faulted: {sorted(faulted_pids)})"
                    )
        dead = retry_db(lambda: DeadLetter.objects.filter(job_id__in=ids).count())
        if expect == JobState.SUCCEEDED and dead:
            problems.append(f"{dead} jobs were dead-lettered")
        assert not problems, "\n".join(problems[:30])
        return outcome


@pytest.fixture
def chaos(chaos_server, chaos_bouncer, start_worker) -> Iterator[Chaos]:
    print(f"\nchaos: CHAOS_SEED={SEED} CHAOS_ROUNDS={ROUNDS}")
    yield Chaos(chaos_server, chaos_bouncer, start_worker)
    connection.close()  # the server may have restarted since the last query
