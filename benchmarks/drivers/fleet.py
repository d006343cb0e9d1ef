"""The fleet check: one fleet size of django_dispatch workers, through PgBouncer.

``python -m drivers.fleet standard --db URL --worker-db BOUNCER_URL --workers N
--concurrency C --jobs J --rounds R ...`` (``fleet.py`` runs it per size):

1. starts N ``rundispatch --concurrency C`` processes on an empty queue,
   through PgBouncer in transaction mode (LISTEN off, as docs/deployment.md
   says), and waits until every one has registered and settled, so that
   50 Django processes starting on a small machine are not timed; then
   measures the idle fleet over ``IDLE_SECONDS``: its CPU (workers, server,
   PgBouncer) and the statements it sends, which every process pays whatever
   the load; with ``--trickle-rate``, jobs enqueued one per transaction onto
   the idle fleet (claims per job: the LISTEN wake-ups with ``--listen``,
   which connects the workers directly with LISTEN on);
2. R times: commits a backlog of J no-op jobs in one transaction and times
   the fleet draining it, from the commit to the last job's success, while a
   thread samples the server and PgBouncer every ``SAMPLE_SECONDS``;
3. stops the workers and reads their claim timings (``bench.wavetimer``).

Per round it reports:

- throughput: J / seconds from the commit to the last success, and the rate
  between 10% and 90% done (``mid_per_s``: without the pick-up by polling
  and the tail);
- claim latency p50/p99: the wall time of each worker's claim transaction
  (the wave: successes, the claim, the commit) as the worker sees it through
  PgBouncer, waiting for a server connection included; and the claim
  statement's own mean server time (planning + execution, from
  pg_stat_statements) with the jobs it returned per call;
- lock waits: server backends waiting on a heavyweight lock
  (``pg_stat_activity.wait_event_type = 'Lock'``) summed over the samples and
  at most at once, with the statements that waited; and the waits longer
  than ``deadlock_timeout`` that ``log_lock_waits`` wrote to the server log;
- server sessions: the most client backends on the database at once (the
  pool's server connections; the harness's own two are left out), how many
  were on average idle in a transaction (held by a worker between the
  statements of its wave), and the most clients PgBouncer had waiting for one;
- CPU per job of the workers, of PostgreSQL, and PgBouncer's share of its
  one core; other load on the machine; the statements by total server time.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import proc
import psycopg
from harness import Workers, main, percentile

from drivers.dispatch import CHUNK, DispatchDriver

SAMPLE_SECONDS = 0.1
POLL_SECONDS = 0.1
#: Jobs not finished yet, through the claim's and the lease's partial indexes:
#: a count over the table (finished rows, dead versions) cost 30-50 ms a poll,
#: the largest statement of the round.
LEFT_SQL = (
    "SELECT (SELECT count(*) FROM django_dispatch_job WHERE state = 'pending' "
    "AND resource_shape IS NULL) + (SELECT count(*) FROM django_dispatch_job "
    "WHERE state = 'running')"
)
#: Starting 50 Django processes on two busy cores takes a while.
START_TIMEOUT = 600.0
STALL_SECONDS = 60.0
#: After every worker has registered: their first heartbeats, elections and
#: empty claims are over before the backlog lands.
SETTLE_SECONDS = 3.0
#: The idle fleet's CPU is measured over this long, before the first round.
IDLE_SECONDS = 5.0

ACTIVITY_SQL = """
SELECT pid, state, wait_event_type, wait_event, left(regexp_replace(query, '\\s+', ' ', 'g'), 70)
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND NOT pid = ANY(%s)
"""
STATEMENTS_SQL = """
SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_plan_time,
       total_exec_time, rows
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_plan_time + total_exec_time DESC
"""
#: The claim statement (``store.sources.fused_pg``), recognised by its text.
CLAIM_MARK = "candidates AS MATERIALIZED"


class Sampler(threading.Thread):
    """Samples the server's sessions and waits, and PgBouncer's pool, until stopped."""

    def __init__(self, db: str, bouncer_admin: str, exclude: list[int], dbname: str) -> None:
        super().__init__(daemon=True)
        self.db, self.bouncer_admin, self.exclude, self.dbname = db, bouncer_admin, exclude, dbname
        self.stopping = threading.Event()
        self.samples = 0
        self.sessions: list[int] = []
        self.active: list[int] = []
        self.in_transaction: list[int] = []  # idle in transaction: waiting for their client
        self.lock_waits: list[int] = []
        self.waits: Counter[str] = Counter()  # wait events of active backends
        self.lock_queries: Counter[str] = Counter()  # what the lock waiters ran
        self.cl_waiting: list[int] = []
        self.maxwait_ms: list[float] = []

    def run(self) -> None:
        with contextlib.ExitStack() as stack:
            conn = stack.enter_context(psycopg.connect(self.db, autocommit=True))
            exclude = [*self.exclude, conn.info.backend_pid]
            bouncer = None
            if self.bouncer_admin:
                admin = stack.enter_context(psycopg.connect(self.bouncer_admin, autocommit=True))
                bouncer = psycopg.ClientCursor(admin)  # the console speaks simple queries only
            while not self.stopping.wait(SAMPLE_SECONDS):
                self.sample(conn, exclude, bouncer)

    def sample(self, conn, exclude: list[int], bouncer) -> None:
        rows = conn.execute(ACTIVITY_SQL, [exclude]).fetchall()
        self.samples += 1
        self.sessions.append(len(rows))
        active = [r for r in rows if r[1] == "active"]
        self.active.append(len(active))
        self.in_transaction.append(sum(1 for r in rows if r[1] == "idle in transaction"))
        locked = [r for r in rows if r[2] == "Lock"]
        self.lock_waits.append(len(locked))
        for _pid, _state, kind, event, _query in active:
            self.waits[f"{kind}:{event}" if kind else "CPU (no wait event)"] += 1
        for row in locked:
            self.lock_queries[f"{row[3]}: {row[4]}"] += 1
        if bouncer is not None:
            bouncer.execute("SHOW POOLS")
            names = [d.name for d in bouncer.description]
            for values in bouncer.fetchall():
                pool = dict(zip(names, values, strict=True))
                if pool["database"] == self.dbname:
                    self.cl_waiting.append(int(pool["cl_waiting"]))
                    us = int(pool["maxwait"]) * 1_000_000 + int(pool.get("maxwait_us") or 0)
                    self.maxwait_ms.append(us / 1000)

    def stop(self) -> dict:
        self.stopping.set()
        self.join(10)
        n = max(1, self.samples)
        return {
            "samples": self.samples,
            "server_sessions": max(self.sessions, default=0),
            "active_backends_mean": sum(self.active) / n,
            "idle_in_transaction_mean": sum(self.in_transaction) / n,
            "lock_waits_per_sample": sum(self.lock_waits) / n,
            "lock_waits_max": max(self.lock_waits, default=0),
            "lock_wait_samples": sum(self.lock_waits),
            "wait_events": dict(self.waits.most_common(6)),
            "lock_waiters": dict(self.lock_queries.most_common(4)),
            "bouncer_waiting_max": max(self.cl_waiting, default=0),
            "bouncer_waiting_mean": sum(self.cl_waiting) / max(1, len(self.cl_waiting)),
            "bouncer_maxwait_ms": max(self.maxwait_ms, default=0.0),
        }


class FleetDriver(DispatchDriver):
    @classmethod
    def add_arguments(cls, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--server-log", default="", help="the server's log (log_lock_waits)")
        parser.add_argument("--bouncer-admin", default="", help="PgBouncer's console URL")
        parser.add_argument("--bouncer-pid", type=int, default=0)
        # Only this many workers tick cron (0: all, the default).
        parser.add_argument("--schedulers", type=int, default=0)
        # Workers on direct connections with LISTEN on (default: through the pooler, off).
        parser.add_argument("--listen", action="store_true")
        # Before the rounds: jobs enqueued one per transaction at this rate (0: none).
        parser.add_argument("--trickle-rate", type=float, default=0.0)
        parser.add_argument("--trickle-seconds", type=float, default=5.0)

    def worker_argv(self, concurrency: int) -> list[str]:
        """Called once per process: past ``--schedulers`` of them, ``--no-scheduler``."""
        self.started = getattr(self, "started", 0) + 1
        argv = super().worker_argv(concurrency)
        if self.args.schedulers and self.started > self.args.schedulers:
            argv.append("--no-scheduler")
        return argv

    def standard(self, conn: psycopg.Connection, logdir: Path) -> dict:
        args = self.args
        waves = logdir / "waves"
        waves.mkdir()
        # Read by the workers' settings (LISTEN off) and by bench.wavetimer.
        os.environ["BENCH_WAVE_TIMES"] = str(waves)
        if not args.listen:
            os.environ["BENCH_POOLER"] = "1"
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        started = time.monotonic()
        workers = Workers(self, args.workers, args.concurrency, logdir)
        rounds: list[dict] = []
        try:
            self.wait_registered(conn, workers)
            start_seconds = time.monotonic() - started
            idle = self.idle(conn, workers)
            if args.trickle_rate:
                idle["trickle"] = self.trickle(conn, workers)
            for index in range(args.rounds):
                rounds.append(self.round(conn, workers, index))
        finally:
            workers.stop()
        claim_latency(rounds, waves)
        # Every job ran once: one attempt each, succeeded (a lease lost and
        # reclaimed, or two workers on one job, would show here).
        not_once = conn.execute(
            "SELECT count(*) FROM django_dispatch_job WHERE attempts <> 1 OR state <> 'succeeded'"
        ).fetchone()[0]
        return {"processes": args.workers, "slots": args.concurrency, "jobs": args.jobs,
                "start_seconds": start_seconds, "idle": idle, "rounds": rounds,
                "jobs_not_run_once": not_once}  # fmt: skip

    def wait_registered(self, conn, workers: Workers) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while conn.execute("SELECT count(*) FROM django_dispatch_worker").fetchone()[0] < len(
            workers.procs
        ):
            workers.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not all registered after {START_TIMEOUT:.0f} s")
            time.sleep(0.5)
        time.sleep(SETTLE_SECONDS)

    def idle(self, conn, workers: Workers) -> dict:
        """The fleet with nothing to do: its CPU and its statements over ``IDLE_SECONDS``.

        What every process does whatever the load (polls, duties), which a
        fleet pays N times: on a small machine it is CPU the jobs do not get.
        """
        conn.execute("SELECT pg_stat_statements_reset()")
        postmaster = proc.parent(conn.info.backend_pid)
        before = _cpu(workers, postmaster, self.args.bouncer_pid)
        time.sleep(IDLE_SECONDS)
        after = _cpu(workers, postmaster, self.args.bouncer_pid)
        w, pg, bouncer, _machine, _me = (b - a for a, b in zip(before, after, strict=True))
        rows = conn.execute(STATEMENTS_SQL).fetchall()
        return {
            "worker_cpu_pct": 100 * w / IDLE_SECONDS,
            "pg_cpu_pct": 100 * pg / IDLE_SECONDS,
            "bouncer_cpu_pct": 100 * bouncer / IDLE_SECONDS,
            "statements_per_s": sum(r[1] for r in rows) / IDLE_SECONDS,
            "top_statements": [{"query": q[:90], "calls": c} for q, c, *_ in rows[:6]],
        }

    def trickle(self, conn, workers: Workers) -> dict:
        """Jobs one per transaction at ``--trickle-rate`` onto the idle fleet: how
        many claims each job costs. With LISTEN on, every enqueue's NOTIFY wakes
        every idle worker, and each of them claims."""
        args = self.args
        count = int(args.trickle_rate * args.trickle_seconds)
        conn.execute("SELECT pg_stat_statements_reset()")
        postmaster = proc.parent(conn.info.backend_pid)
        before, started = _cpu(workers, postmaster, args.bouncer_pid), time.monotonic()
        for index in range(count):
            time.sleep(max(0.0, started + index / args.trickle_rate - time.monotonic()))
            self.tasks.noop.enqueue()
        deadline = time.monotonic() + 30
        while conn.execute(LEFT_SQL).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        elapsed = time.monotonic() - started
        after = _cpu(workers, postmaster, args.bouncer_pid)
        w, pg, bouncer, _machine, _me = (b - a for a, b in zip(before, after, strict=True))
        rows = conn.execute(STATEMENTS_SQL).fetchall()
        claims = sum(r[1] for r in rows if CLAIM_MARK in r[0])
        return {
            "jobs": count,
            "rate": args.trickle_rate,
            "claims_per_job": claims / max(1, count),
            "cpu_pct": 100 * (w + pg + bouncer) / elapsed,
            "worker_cpu_pct": 100 * w / elapsed,
        }

    def enqueue_backlog(self) -> None:
        """``--jobs`` no-op jobs, committed at once: every worker sees all or none."""
        from django.db import transaction

        from django_dispatch import enqueue_many

        with transaction.atomic():
            for start in range(0, self.args.jobs, CHUNK):
                enqueue_many(self.tasks.noop, [((), {})] * min(CHUNK, self.args.jobs - start))

    def round(self, conn, workers: Workers, index: int) -> dict:
        args, jobs = self.args, self.args.jobs
        conn.execute("VACUUM ANALYZE django_dispatch_job")  # each round on fresh statistics
        conn.execute("SELECT pg_stat_statements_reset()")
        log_from = _size(args.server_log)
        mine = [conn.info.backend_pid, _django_pid()]  # not the fleet's sessions
        sampler = Sampler(self.db, args.bouncer_admin, mine, _dbname(self.db))
        postmaster = proc.parent(conn.info.backend_pid)
        sampler.start()
        self.enqueue_backlog()
        committed, wall = time.monotonic(), time.time()
        before = _cpu(workers, postmaster, args.bouncer_pid)
        marks: dict[float, float] = {}
        changed, last = committed, None
        while True:
            left, now = conn.execute(LEFT_SQL).fetchone()[0], time.monotonic()
            for share in (0.9, 0.1):
                if left <= share * jobs and share not in marks:
                    marks[share] = now
            if left == 0:
                break
            if left != last:
                changed, last = now, left
            elif now - changed > STALL_SECONDS:
                raise RuntimeError(f"stalled at {left} jobs left:\n{workers.logs()}")
            workers.check_alive()
            time.sleep(POLL_SECONDS)
        after = _cpu(workers, postmaster, args.bouncer_pid)
        seconds = now - committed
        result = {
            "round": index + 1,
            "window": [wall, wall + seconds],
            "seconds": seconds,
            "per_s": jobs / seconds,
            # None when one poll saw both marks pass (too short a drain to tell).
            "mid_per_s": (
                0.8 * jobs / (marks[0.1] - marks[0.9]) if marks[0.1] > marks[0.9] else None
            ),
            **sampler.stop(),
            **statements(conn, jobs),
            "log_lock_waits": _lock_wait_lines(args.server_log, log_from),
        }
        w, pg, bouncer, machine, me = (b - a for a, b in zip(before, after, strict=True))
        result["worker_cpu_ms_per_job"] = 1000 * w / jobs
        result["pg_cpu_ms_per_job"] = 1000 * pg / jobs
        result["bouncer_cpu_pct"] = 100 * bouncer / seconds
        result["other_cpu_pct"] = 100 * max(0.0, machine - w - pg - bouncer - me) / seconds
        return result


def statements(conn, jobs: int) -> dict:
    """pg_stat_statements over the round: the claim statement, and the top statements."""
    rows = conn.execute(STATEMENTS_SQL).fetchall()
    out: dict = {"top_statements": [
        {"query": q[:90], "calls": c, "total_ms": round(p + e, 1), "rows": r}
        for q, c, p, e, r in rows[:8]
    ]}  # fmt: skip
    claim = [r for r in rows if CLAIM_MARK in r[0]]
    if claim:
        calls = sum(r[1] for r in claim)
        total = sum(r[2] + r[3] for r in claim)
        out["claim_calls"] = calls
        out["claim_server_ms"] = total / max(1, calls)
        out["claim_rows_per_call"] = sum(r[4] for r in claim) / max(1, calls)
        out["claim_server_ms_per_job"] = total / jobs
    out["server_ms_per_job"] = sum(r[2] + r[3] for r in rows) / jobs
    return out


def claim_latency(rounds: list[dict], waves: Path) -> None:
    """Each round's claim transactions (from ``bench.wavetimer``) inside its window."""
    timed: list[tuple[float, float, int, int]] = []
    for path in waves.glob("*.txt"):
        for line in path.read_text().splitlines():
            wall, seconds, written, claimed = line.split()
            timed.append((float(wall), float(seconds), int(written), int(claimed)))
    for result in rounds:
        start, end = result["window"]
        inside = [t for t in timed if start <= t[0] <= end]
        if not inside:
            continue
        ms = [1000 * t[1] for t in inside]
        result["claim_p50_ms"] = percentile(ms, 50)
        result["claim_p99_ms"] = percentile(ms, 99)
        result["waves"] = len(inside)
        claiming = [t[3] for t in inside if t[3]]
        result["jobs_per_claim"] = statistics.fmean(claiming) if claiming else 0.0
        result["empty_claims_pct"] = 100 * sum(1 for t in inside if not t[3]) / len(inside)


def _cpu(workers: Workers, postmaster: int, bouncer: int) -> tuple[float, ...]:
    mine = os.times()
    return (sum(workers.cpu_seconds()), proc.cpu_seconds(postmaster, reaped=True),
            proc.cpu_seconds(bouncer) if bouncer else 0.0, proc.machine_cpu_seconds(),
            mine.user + mine.system)  # fmt: skip


def _size(path: str) -> int:
    return Path(path).stat().st_size if path and Path(path).exists() else 0


def _lock_wait_lines(path: str, start: int) -> int:
    """``log_lock_waits``: the waits longer than ``deadlock_timeout`` since ``start``."""
    if not path or not Path(path).exists():
        return 0
    with open(path, "rb") as log:
        log.seek(start)
        return log.read().count(b"still waiting for")


def _django_pid() -> int:
    """The backend of this process's Django connection (the one that enqueues)."""
    from django.db import connection

    connection.ensure_connection()
    return connection.connection.info.backend_pid


def _dbname(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?")[0]


if __name__ == "__main__":
    main(FleetDriver)
