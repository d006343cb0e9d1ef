"""The measurements, identical for every system; each driver plugs into them.

A driver module subclasses ``Driver`` and calls ``main(MyDriver)``. It runs in
its system's own virtualenv (so this module uses only the standard library,
psycopg and ``proc``), is given a fresh, empty database, and prints one JSON
object with its results on stdout. ``run.py`` collects them.

Phases (the first command-line argument):

``standard``
    enqueue rate (one job per transaction), drain rate of those jobs with
    W worker processes x C concurrency plus the workers' peak RSS, idle
    worker CPU, enqueue->start latency under a light steady load, bulk
    enqueue rate.
``drain``
    only the drain rate, of a backlog the driver prepares (``prepare_backlog``),
    for the claim-flatness and partition checks; with ``--backlog realistic``,
    of ``--jobs`` realistic jobs (below).
``rss``
    the workers' resident memory after 1,000 jobs and after ``--jobs`` jobs.

With ``--sleep-ms MS`` the ``drain`` phase's backlog is ``--jobs`` async
jobs (``async def``) that each await ``asyncio.sleep(MS / 1000)`` and return
nothing (``enqueue_sleep_bulk``, with each system's bulk API, before the
workers start): the I/O-bound workload of the async check (#20). The
duration reaches the workers in ``$BENCH_SLEEP_MS``.

The ``standard`` phase includes the *realistic* drain: ``--realistic-jobs``
jobs (fewer where a probe drain says they would take more than
``REALISTIC_BUDGET_SECONDS``) that each INSERT a row into ``bench_order`` and UPDATE it (two
statements in autocommit, through the ORM for Django systems, through a
connection of the worker's own for the others), checked afterwards: every
row present and updated, or the measurement fails. A driver may drain other
bodies of the same job after it (``Driver.realistic_variants``: PgQueuer's
job written with Django's ORM).

Worker processes are started fresh for each measurement and stopped with
SIGTERM afterwards; completion is observed by polling the database.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import proc
import psycopg
import pyspy

POLL_SECONDS = 0.05
STOP_TIMEOUT = 20.0
STALL_SECONDS = 60.0


class Driver:
    """One queue system, as the harness drives it.

    ``unfinished_sql`` counts the jobs not finished yet (queued or running);
    the harness polls it to know when a drain is over.
    """

    unfinished_sql = ""
    #: The configurations this driver can run (``--config``), each described
    #: for the report. "matched" gives every system the same budget of jobs in
    #: flight (W processes x C); "defaults" runs the library as its documentation
    #: ships it. A peer is compared at whichever is faster (see ``report``).
    #: The first is the slot-matched one, the default of ``--config``.
    CONFIGS: dict[str, str] = {"matched": "W processes x C jobs in flight"}

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.db = args.db
        self.config = getattr(args, "config", "matched")

    def processes(self, workers: int, concurrency: int) -> int:
        """How many worker processes a measurement with W x C starts."""
        return workers

    def config_argv(self) -> list[str]:
        """Pass the configuration on to this driver's worker processes."""
        return ["--config", self.config]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Options of this driver's own phases."""

    def setup(self) -> None:
        """Create the system's schema in the empty database."""
        raise NotImplementedError

    def enqueue_noop(self) -> None:
        """Enqueue one no-op job in its own transaction."""
        raise NotImplementedError

    def enqueue_record(self, seq: int) -> None:
        """Enqueue one job that appends ``seq`` and its start time to the latency file."""
        raise NotImplementedError

    def enqueue_bulk(self, count: int) -> bool:
        """Enqueue ``count`` no-op jobs with the system's bulk API; False if it has none."""
        return False

    def enqueue_realistic_bulk(self, count: int) -> None:
        """Enqueue ``count`` realistic jobs (``realistic(seq)`` for seq in 0..count-1),
        with the body ``realistic_body`` names ("": the driver's own)."""
        raise NotImplementedError

    #: The realistic job's body being measured: "" (the driver's own), or one of
    #: ``realistic_variants()``.
    realistic_body = ""

    def realistic_variants(self) -> list[str]:
        """Other bodies of the realistic job this configuration drains too, each after
        the driver's own; variant V's results are ``V_realistic_*`` (e.g. "orm":
        PgQueuer's job written with Django's ORM)."""
        return []

    def enqueue_sleep_bulk(self, count: int) -> None:
        """Enqueue ``count`` async jobs that await ``asyncio.sleep`` (``$BENCH_SLEEP_MS``)."""
        raise NotImplementedError

    def worker_argv(self, concurrency: int) -> list[str]:
        """The command line of one worker process."""
        raise NotImplementedError

    def before(self) -> dict:
        """Extra measurements made first, on the empty database (e.g. a baseline)."""
        return {}

    def prepare_backlog(self) -> int:
        """For the ``drain`` phase: queue jobs to drain; return how many."""
        if self.args.sleep_ms:
            self.enqueue_sleep_bulk(self.args.jobs)
            return self.args.jobs
        if not self.enqueue_bulk(self.args.jobs):
            for _ in range(self.args.jobs):
                self.enqueue_noop()
        return self.args.jobs

    def standard(self, conn: psycopg.Connection, logdir: Path) -> dict:
        """The ``standard`` phase; a driver may measure differently."""
        return standard(self, conn, logdir)

    def close(self) -> None:
        """Release connections before the database is dropped."""


class Workers:
    """W worker processes of one driver, logging to files in ``logdir``."""

    def __init__(self, driver: Driver, count: int, concurrency: int, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []
        self.started = time.monotonic()
        start = len(list(logdir.glob("worker-*")))  # earlier measurements' logs stay
        for index in range(start, start + driver.processes(count, concurrency)):
            log = open(logdir / f"worker-{index}.log", "w")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen(
                    driver.worker_argv(concurrency),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "DATABASE_URL": driver.args.worker_db or driver.db},
                )
            )
            log.close()

    def check_alive(self) -> None:
        """Raise if a worker failed, or if all have exited (a drain can no longer end)."""
        codes = [p.poll() for p in self.procs]
        if any(code for code in codes) or all(code is not None for code in codes):
            raise RuntimeError(f"workers exited with {codes}:\n{self.logs()}")

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f.read_text()[-tail:] for f in sorted(self.logdir.glob("worker-*")))

    def peak_rss_mb(self) -> float:
        return max(proc.peak_rss_mb(p.pid) for p in self.procs)

    def rss_mb(self) -> float:
        return max(proc.rss_mb(p.pid) for p in self.procs)

    def cpu_seconds(self) -> list[float]:
        return [proc.cpu_seconds(p.pid) for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for pid in reversed(proc.tree(p.pid)):
                    os.kill(pid, signal.SIGKILL)
                p.wait()


def unfinished(conn: psycopg.Connection, driver: Driver) -> int:
    return conn.execute(driver.unfinished_sql).fetchone()[0]


def poll_unfinished(conn, driver: Driver, workers: Workers, at_most: int):
    """Yield (monotonic time, unfinished jobs) until at most ``at_most`` are left.

    Raises when a worker fails or when no job finished for ``STALL_SECONDS``
    (a broken worker that keeps retrying would otherwise hang the run).
    """
    changed_at, last = time.monotonic(), None
    while True:
        left, now = unfinished(conn, driver), time.monotonic()
        yield now, left
        if left <= at_most:
            return
        if left != last:
            changed_at, last = now, left
        elif now - changed_at > STALL_SECONDS:
            raise RuntimeError(
                f"stalled: {left} jobs unfinished, none finished for {STALL_SECONDS:.0f} s; "
                f"worker logs:\n{workers.logs()}"
            )
        if any(p.poll() for p in workers.procs):
            workers.check_alive()
        time.sleep(POLL_SECONDS)


def wait_until(conn, driver: Driver, workers: Workers, at_most: int) -> float:
    """Wait until at most ``at_most`` jobs are unfinished; return the monotonic time."""
    *_, (now, _left) = poll_unfinished(conn, driver, workers, at_most)
    return now


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


# --- the measurements ----------------------------------------------------------


def measure_enqueue(driver: Driver, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        driver.enqueue_noop()
    return count / (time.perf_counter() - started)


def measure_bulk(driver: Driver, count: int) -> float | None:
    started = time.perf_counter()
    if not driver.enqueue_bulk(count):
        return None
    return count / (time.perf_counter() - started)


#: Client sessions on the server besides the harness's own (PgBouncer's server
#: connections count as sessions; its clients do not).
SESSIONS_SQL = "SELECT count(*) - 1 FROM pg_stat_activity WHERE backend_type = 'client backend'"


def measure_drain(driver: Driver, conn, count: int, logdir: Path) -> dict:
    """Start the workers on ``count`` queued jobs; time until all are finished.

    ``drain_per_s`` counts from the workers' start, as a user sees it;
    ``steady_drain_per_s`` from the first finished job, leaving out start-up.
    CPU per job, of the workers and of the PostgreSQL server, is counted over
    the same steady part: on a small machine CPU is what runs out first.
    """
    args = driver.args
    # Planner statistics, as autovacuum would have them on a long-lived table: without
    # them a claim's plan depends on whether autovacuum happened to run yet.
    conn.execute("ANALYZE")
    postmaster = proc.parent(conn.info.backend_pid)
    workers = Workers(driver, args.workers, args.concurrency, logdir)
    first: tuple[float, int, tuple] | None = None  # time, jobs left, CPU counters
    profiler = pyspy.from_env()  # profile_worker.py: py-spy over the steady part

    def cpu() -> tuple[float, float, float, float]:
        """Workers', PostgreSQL's, this process's and the whole machine's CPU seconds."""
        mine = os.times()
        return (sum(workers.cpu_seconds()), proc.cpu_seconds(postmaster, reaped=True),
                mine.user + mine.system, proc.machine_cpu_seconds())  # fmt: skip

    sessions = 0  # the server's client sessions, at most, while draining
    try:
        for done_at, left in poll_unfinished(conn, driver, workers, 0):
            if first is None and 0 < left < count:
                first = (done_at, left, cpu())
                if profiler:
                    # With ``--processes``, the children run the jobs.
                    profiler.attach([pid for p in workers.procs for pid in proc.tree(p.pid)])
            sessions = max(sessions, conn.execute(SESSIONS_SQL).fetchone()[0])
        last = cpu()
        peak = workers.peak_rss_mb()
    finally:
        if profiler:
            profiler.stop()
        workers.stop()
    result = {
        "drain_per_s": count / (done_at - workers.started),
        "peak_rss_mb": peak,
        "server_sessions": sessions,
    }
    if first and done_at > first[0]:
        at, left, before = first
        w, pg, me, machine = (b - a for a, b in zip(before, last, strict=True))
        result["steady_drain_per_s"] = left / (done_at - at)
        result["steady_jobs"] = left  # the jobs the CPU counters (and a profile) span
        result["worker_cpu_ms_per_job"] = 1000 * w / left
        result["pg_cpu_ms_per_job"] = 1000 * pg / left
        # CPU that neither this benchmark nor its server used: other work competing.
        result["other_cpu_pct"] = 100 * max(0.0, machine - w - pg - me) / (done_at - at)
    return result


def measure_idle_and_latency(driver: Driver, conn, logdir: Path) -> dict:
    """Idle workers: their CPU use over a quiet window, then enqueue->start latency.

    Jobs are enqueued at ``--latency-rate`` per second; each records its start
    with ``time.time()`` in a file, compared with ``time.time()`` taken right
    after its enqueue returned (the job committed). Same machine, same clock.
    """
    args = driver.args
    latency_file = logdir / "latency.txt"
    latency_file.touch()
    os.environ["BENCH_LATENCY_FILE"] = str(latency_file)
    workers = Workers(driver, args.workers, args.concurrency, logdir)
    try:
        time.sleep(2.0)  # start-up
        for _ in range(2 * args.workers):  # warm-up: every worker connected and serving
            driver.enqueue_noop()
        wait_until(conn, driver, workers, 0)
        time.sleep(1.0)
        cpu_before = workers.cpu_seconds()
        time.sleep(args.idle_seconds)
        cpu_after = workers.cpu_seconds()
        used = [b - a for a, b in zip(cpu_before, cpu_after, strict=True)]
        idle_cpu = 100 * max(used) / args.idle_seconds
        workers.check_alive()

        count = int(args.latency_seconds * args.latency_rate)
        enqueued: dict[int, float] = {}
        next_at = time.monotonic()
        for seq in range(count):
            time.sleep(max(0.0, next_at - time.monotonic()))
            driver.enqueue_record(seq)
            enqueued[seq] = time.time()
            next_at += 1 / args.latency_rate
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            started = dict(line.split() for line in latency_file.read_text().splitlines())
            if len(started) >= count:
                break
            time.sleep(0.2)
    finally:
        workers.stop()
    latencies = [
        max(0.0, float(started[str(seq)]) - t) * 1000
        for seq, t in enqueued.items()
        if str(seq) in started
    ]
    result = {"idle_cpu_pct": idle_cpu, "latency_missing": count - len(latencies)}
    for p in (50, 95, 99):
        result[f"latency_p{p}_ms"] = percentile(latencies, p) if latencies else None
    return result


def measure_rss(driver: Driver, conn, logdir: Path) -> dict:
    """Workers' resident memory after 1,000 jobs and after all ``--jobs`` jobs."""
    total = driver.prepare_backlog()
    workers = Workers(driver, driver.args.workers, driver.args.concurrency, logdir)
    try:
        wait_until(conn, driver, workers, total - 1000)
        after_1k = workers.rss_mb()
        wait_until(conn, driver, workers, 0)
        after_all = workers.rss_mb()
    finally:
        workers.stop()
    return {"rss_after_1k_mb": after_1k, "rss_after_all_mb": after_all, "rss_jobs": total}


#: The realistic job's table, the same for every system (Django's model of it
#: is unmanaged), created by the harness in each fresh database.
ORDER_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS bench_order (
    id bigserial PRIMARY KEY,
    seq integer NOT NULL,
    status varchar(16) NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""
#: What a realistic job does, for the drivers that do not use Django's ORM.
ORDER_INSERT_SQL = "INSERT INTO bench_order (seq, status) VALUES (%s, 'new') RETURNING id"
ORDER_UPDATE_SQL = "UPDATE bench_order SET status = 'done', updated_at = now() WHERE id = %s"


#: A row's realistic drain gets at most this many seconds' worth of jobs, at the
#: rate of a probe drain of ``REALISTIC_PROBE_JOBS`` first: PgQueuer on psycopg
#: drains about 18 of them a second, so its 10,000 took 9 minutes a run. At
#: 120 s the fastest rows (about 1,800/s) keep their 10,000 jobs.
REALISTIC_BUDGET_SECONDS = 120
REALISTIC_PROBE_JOBS = 200


def measure_realistic(driver: Driver, conn, logdir: Path) -> dict:
    """Drain realistic jobs that each insert and update a row; check the rows.

    ``--realistic-jobs`` of them, or fewer where the probe's rate says they
    would take more than ``REALISTIC_BUDGET_SECONDS``; ``realistic_jobs``
    says how many. The probe runs for every system alike, so it warms up
    none of them more than another.
    """
    count = driver.args.realistic_jobs
    if not count:
        return {}
    conn.execute(ORDER_TABLE_SQL)
    probe = min(count, REALISTIC_PROBE_JOBS)
    probed = _drain_realistic(driver, conn, probe, logdir)
    rate = probed.get("steady_drain_per_s") or probed["drain_per_s"]
    count = min(count, max(probe, int(rate * REALISTIC_BUDGET_SECONDS)))
    drained = _drain_realistic(driver, conn, count, logdir)
    result = {f"realistic_{k}": v for k, v in drained.items() if "drain" in k or "cpu_ms" in k}
    return {**result, "realistic_jobs": count}


def _drain_realistic(driver: Driver, conn, count: int, logdir: Path) -> dict:
    """Enqueue and drain ``count`` realistic jobs on an empty table; check every row."""
    conn.execute("TRUNCATE bench_order")
    driver.enqueue_realistic_bulk(count)
    drained = measure_drain(driver, conn, count, logdir)
    done, rows = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'done'), count(DISTINCT seq) FROM bench_order"
    ).fetchone()
    if done != count or rows != count:
        raise RuntimeError(f"realistic jobs: {done} rows updated, {rows} distinct, of {count}")
    return drained


def standard(driver: Driver, conn, logdir: Path) -> dict:
    """Every standard measurement, in an order where each leaves the queue empty."""
    args = driver.args
    result = driver.before()
    result["enqueue_per_s"] = measure_enqueue(driver, args.jobs)
    result.update(measure_drain(driver, conn, args.jobs, logdir))
    result.update(measure_idle_and_latency(driver, conn, logdir))
    result.update(measure_realistic(driver, conn, logdir))
    for variant in driver.realistic_variants():
        driver.realistic_body = variant
        try:
            drained = measure_realistic(driver, conn, logdir)
        finally:
            driver.realistic_body = ""
        result.update({f"{variant}_{k}": v for k, v in drained.items()})
    result["bulk_per_s"] = measure_bulk(driver, args.bulk_jobs)  # last: its jobs stay queued
    return result


def run_phase(driver: Driver, logdir: Path) -> dict:
    args = driver.args
    driver.setup()
    with psycopg.connect(args.db, autocommit=True) as conn:
        if args.phase == "drain" and args.backlog == "realistic":
            conn.execute(ORDER_TABLE_SQL)
            return _drain_realistic(driver, conn, args.jobs, logdir)
        if args.phase == "drain":
            return measure_drain(driver, conn, driver.prepare_backlog(), logdir)
        if args.phase == "bulk_scale":
            return driver.bulk_scale()  # type: ignore[attr-defined]
        if args.phase == "rss":
            return measure_rss(driver, conn, logdir)
        return driver.standard(conn, logdir)


def main(driver_class: type[Driver]) -> None:
    """Command line of a driver module: ``python -m drivers.X PHASE --db URL ...``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["standard", "drain", "rss", "bulk_scale", "worker"])
    parser.add_argument("--db", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--bulk-jobs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--latency-rate", type=float, default=20.0)
    configs = list(driver_class.CONFIGS)  # the first is the slot-matched one
    parser.add_argument("--config", default=configs[0], choices=configs)
    parser.add_argument("--realistic-jobs", type=int, default=0)
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="drain phase: async jobs "
                        "that await asyncio.sleep(MS / 1000) instead of no-ops")  # fmt: skip
    parser.add_argument("--backlog", choices=["noop", "realistic"], default="noop",
                        help="drain phase: no-op jobs, or --jobs realistic jobs (each row "
                        "checked afterwards)")  # fmt: skip
    parser.add_argument("--worker-db", default="", help="the workers' database URL, if not --db "
                        "(e.g. through PgBouncer)")  # fmt: skip
    driver_class.add_arguments(parser)
    args = parser.parse_args()
    if args.sleep_ms:  # for the sleep jobs, in this process's workers
        os.environ["BENCH_SLEEP_MS"] = repr(args.sleep_ms)
    driver = driver_class(args)
    if args.phase == "worker":  # a driver that runs its own worker loop
        driver.run_worker()  # type: ignore[attr-defined]
        return
    with tempfile.TemporaryDirectory(prefix="dispatch-bench-") as tmp:
        try:
            result = run_phase(driver, Path(tmp))
        finally:
            driver.close()
    json.dump(result, sys.stdout)
    print()
