"""Benchmark django_dispatch against its peers on a throwaway PostgreSQL.

One command from the repository root:

    .venv/bin/python benchmarks/run.py            # full: 10,000 jobs, 3 runs, 2 x 8
    .venv/bin/python benchmarks/run.py --quick    # smoke test, about two minutes

It creates a virtualenv per peer under ``benchmarks/.venv-*`` (pinned
versions, see ``venvs.py``), starts its own PostgreSQL with default
durability, gives every system a fresh database in every run, and writes a
Markdown report to ``benchmarks/results/<date>-<host>.md`` and
``benchmarks/results/latest.md`` (with ``--tag T``: ``<date>-<host>-T.md`` and
``latest-T.md``; ``--quick`` implies ``--tag quick``, so that a smoke test
never replaces real results).
What each measurement means: ``harness.py``; each system: ``drivers/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from statistics import median

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import fleet  # noqa: E402
import proc  # noqa: E402
import report  # noqa: E402
import venvs  # noqa: E402
from pgserver import PgServer  # noqa: E402

SYSTEMS = {  # name -> driver module
    "dispatch": "drivers.dispatch",
    "django-tasks-db": "drivers.tasks_db",
    "procrastinate": "drivers.procrastinate",
    "pgqueuer": "drivers.pgqueuer",
    "chancy": "drivers.chancy",
    "raw": "drivers.raw",
}
#: Each peer's configurations (see the drivers' ``CONFIGS``). The first is
#: slot-matched, the only one ``--peer-configs matched`` runs: every system
#: gets the same jobs in flight; the others run the library as its
#: documentation ships it. A peer is compared at whichever row is faster.
#: PgQueuer's rows each name the driver its workers run on: asyncpg + uvloop
#: (as ``pgq run`` runs them, first: the way PgQueuer documents) or psycopg
#: on plain asyncio, each slot-matched and at its defaults.
PEER_CONFIGS = {
    # Ours at Django's defaults (no prepared statements), and with psycopg's
    # prepared statements on, as a site on direct connections may run it:
    # asyncpg, under PgQueuer, prepares every statement. The targets count
    # the defaults row only.
    "dispatch": ["matched", "prepared"],
    "django-tasks-db": ["matched", "defaults"],
    "procrastinate": ["matched", "async", "defaults"],
    "pgqueuer": ["asyncpg+uvloop", "defaults, asyncpg+uvloop", "psycopg", "defaults, psycopg"],
    "chancy": ["matched", "async", "defaults"],
}
#: Options passed through to every driver (see ``harness.main``).
DRIVER_OPTIONS = ["jobs", "bulk_jobs", "workers", "concurrency", "idle_seconds",
                  "latency_seconds", "latency_rate", "realistic_jobs"]  # fmt: skip
QUICK = {
    "jobs": 1000, "bulk_jobs": 5000, "realistic_jobs": 1000, "runs": 1, "idle_seconds": 3.0,
    "latency_seconds": 3.0, "flatness_rows": 100_000, "partition_keys": 100,
    "scale_backlog": 100_000, "rss_jobs": 10_000, "quiet_wait": 10.0, "async_sleep_jobs": 1000,
    "fleet_sizes": "1,2,5", "fleet_jobs": 2000, "fleet_rounds": 1,
}  # fmt: skip
#: The async check: a row whose slots cap its rate (W x slots / sleep) gets at
#: most this many seconds' worth of jobs, so that procrastinate at its default
#: concurrency of 1 (40 jobs/s with 2 processes) does not take minutes per run.
ASYNC_SLEEP_BUDGET_SECONDS = 60


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of: "
                   + ", ".join(SYSTEMS))  # fmt: skip
    p.add_argument("--peer-configs", choices=["all", "matched"], default="all",
                   help="all: every peer at each of its configurations (PEER_CONFIGS); "
                   "matched: only at the slot-matched one (faster to run)")  # fmt: skip
    p.add_argument(
        "--skip",
        type=lambda v: [x.strip() for x in v.split(";") if x.strip()],
        default=[],
        help="rows to leave out, ';'-separated, e.g. 'pgqueuer [psycopg]': "
        "a configuration already known to be slower than another of the same peer "
        "(the command line in the report says what was left out)",
    )
    p.add_argument("--jobs", type=int, default=10_000, help="jobs to enqueue and drain")
    p.add_argument("--bulk-jobs", type=int, default=100_000, help="jobs per bulk enqueue")
    p.add_argument("--realistic-jobs", type=int, default=10_000,
                   help="jobs that each insert and update a row (0: skip)")  # fmt: skip
    p.add_argument("--runs", type=int, default=3, help="runs per system; medians are reported")
    p.add_argument("--workers", type=int, default=2, help="worker processes (W)")
    p.add_argument("--concurrency", type=int, default=8, help="jobs in flight per process (C)")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="idle CPU window")
    p.add_argument("--latency-seconds", type=float, default=10.0, help="latency load duration")
    p.add_argument("--latency-rate", type=float, default=20.0, help="latency jobs per second")
    p.add_argument("--flatness", action="store_true", help="dispatch: drain next to N finished")
    p.add_argument("--flatness-rows", type=int, default=1_000_000)
    p.add_argument("--partitions", action="store_true", help="dispatch: keyed vs unkeyed drain")
    p.add_argument("--partition-keys", type=int, default=1000)
    p.add_argument(
        "--concurrency-limits",
        action="store_true",
        help="dispatch: plain drain vs jobs over --concurrency-keys keys with concurrency_limit=2",
    )
    p.add_argument("--concurrency-keys", type=int, default=1000)
    p.add_argument(
        "--scale",
        action="store_true",
        help="dispatch: drain atop a 10k vs a "
        "--scale-backlog pending backlog; one enqueue_many of --scale-backlog rows",
    )
    p.add_argument("--scale-backlog", type=int, default=1_000_000)
    fleet.add_arguments(p)
    p.add_argument(
        "--mixed-sizes",
        action="store_true",
        help="dispatch: drain without vs with resource needs and --capacity (#16)",
    )
    p.add_argument(
        "--async-sleep",
        action="store_true",
        help="async def jobs awaiting asyncio.sleep: django_dispatch's thread executor "
        "(C slots) vs its asyncio executor (--async-concurrency) vs PgQueuer, procrastinate's "
        "async worker and Chancy's async executor, each at its defaults and at "
        "--async-concurrency slots per process (#20)",
    )
    p.add_argument("--async-sleep-jobs", type=int, default=10_000)
    p.add_argument(
        "--async-baseline-ref",
        default="",
        help="also measure this git commit's asyncio executor, as a row of its own next to "
        "ours in every round (a before/after within one run)",
    )
    p.add_argument("--async-sleep-ms", type=float, default=50.0)
    p.add_argument(
        "--async-concurrency",
        type=int,
        default=1000,
        help="async slots per process: rundispatch --async-concurrency, and the peers' "
        "slot-matched async rows (1,000: at 200 our row was bound by its slots, see "
        "docs/performance.md)",
    )
    p.add_argument(
        "--atomic",
        action="store_true",
        help="dispatch: --jobs no-op jobs, then --realistic-jobs realistic jobs, each "
        "without vs with @task(atomic=True) (#31)",
    )
    p.add_argument(
        "--map",
        action="store_true",
        help="dispatch: --jobs plain no-op jobs vs one workflow run whose step maps a no-op "
        "child workflow over --jobs inputs, until that run succeeds (#31)",
    )
    p.add_argument("--rss", action="store_true", help="dispatch: RSS after 1k vs after all")
    p.add_argument("--rss-jobs", type=int, default=100_000)
    p.add_argument("--checks-only", action="store_true", help="only the checks above, not the "
                   "comparison of systems")  # fmt: skip
    p.add_argument(
        "--dispatch-ref",
        default="",
        help="measure this git commit of django_dispatch "
        "(installed into benchmarks/.venv-dispatch-<sha>) instead of the working tree",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="before each measurement, "
        "wait up to this many seconds for other work on the machine to stop",
    )
    p.add_argument("--quick", action="store_true", help="small numbers, a smoke test")
    p.add_argument("--output-dir", type=Path, default=BENCH_DIR / "results")
    p.add_argument("--tag", default="", help="name suffix of the report files (--quick: quick)")
    args = p.parse_args()
    if args.quick:
        defaults = {k: p.get_default(k) for k in QUICK}
        for key, value in QUICK.items():
            if getattr(args, key) == defaults[key]:  # explicit options win
                setattr(args, key, value)
        args.tag = args.tag or "quick"
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {list(SYSTEMS)}")
    return args


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def run_driver(
    python: str, system: str, phase: str, db: str, args, *extra: str, env_extra=None
) -> dict:
    """Run one phase of a driver in its venv; its result is the last line of stdout."""
    common = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in DRIVER_OPTIONS]
    argv = [python, "-m", SYSTEMS[system], phase, "--db", db, *common, *extra]
    env = {**os.environ, "PYTHONPATH": str(BENCH_DIR), **(env_extra or {})}
    # Its own process group, so that an interruption can stop its workers too.
    child = subprocess.Popen(argv, cwd=BENCH_DIR, env=env, text=True, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        stdout, stderr = child.communicate()
    except BaseException:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise
    if child.returncode:
        raise RuntimeError(f"{system} {phase} failed ({child.returncode}):\n{stderr[-4000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


class Bench:
    """One benchmark session: a server, the systems' interpreters, the results."""

    def __init__(self, args: argparse.Namespace, pg: PgServer, pythons: dict[str, str]) -> None:
        self.args, self.pg, self.pythons = args, pg, pythons
        self.counter = 0
        self.background: list[float] = []  # CPU busy before each measurement

    def measure(self, system: str, phase: str, *extra: str, python: str = "", **overrides) -> dict:
        """One phase of one system on a fresh database (dropped afterwards); ``python``:
        another interpreter for it than the system's (an earlier commit of ours)."""
        self.counter += 1
        self.background.append(self.wait_for_quiet())
        name = f"bench_{self.counter}"
        db = self.pg.create_database(name)
        args = argparse.Namespace(**{**vars(self.args), **overrides})
        try:
            return run_driver(python or self.pythons[system], system, phase, db, args, *extra)
        finally:
            self.pg.drop_database(name)

    def wait_for_quiet(self, threshold: float = 0.25) -> float:
        """Wait (up to ``--quiet-wait`` s) until the machine is mostly idle; return its load."""
        deadline, waited = time.monotonic() + self.args.quiet_wait, False
        while (busy := proc.machine_busy(2.0)) > threshold and time.monotonic() < deadline:
            if not waited:
                log(f"  machine {busy:.0%} busy with other work; waiting for it to calm down")
            waited = True
            time.sleep(3)
        return busy

    def configurations(self) -> list[tuple[str, str]]:
        """(system, configuration) pairs to measure, in a fixed interleaving order."""
        pairs = []
        for system in self.args.systems:
            configs = PEER_CONFIGS.get(system, ["matched"])
            if self.args.peer_configs == "matched":
                configs = configs[:1]
            pairs += [(system, c) for c in configs if f"{system} [{c}]" not in self.args.skip]
        return pairs

    def standard(self, failures: dict[str, str]) -> dict[str, list[dict]]:
        """Every system (at each configuration), ``runs`` times, interleaved so that
        drift hits all alike."""
        runs: dict[str, list[dict]] = {}
        for run in range(1, self.args.runs + 1):
            for system, config in self.configurations():
                name = report.row_name(system, config)
                if name in failures:
                    continue
                log(f"run {run}/{self.args.runs}: {name}")
                try:
                    result = self.measure(system, "standard", "--config", config)
                except RuntimeError as e:
                    failures[name] = str(e)
                    log(f"{name} FAILED; left out of the results:\n{e}")
                    rows = [*report.flatten(name, {"batch1": {}, "batch100": {}}),
                            report.orm_row(name)]  # fmt: skip
                    for row in rows:
                        runs.pop(row, None)  # a system is reported whole or not at all
                    continue
                for row, values in report.flatten(name, result).items():
                    runs.setdefault(row, []).append(values)
                numbers = {k: round(v, 1) for k, v in result.items() if isinstance(v, float)}
                log(f"  {json.dumps(numbers)}")
        return runs

    def drain_pair(self, description: str, a: tuple[str, list], b: tuple[str, list], **kw) -> dict:
        """Median drain rates of two backlogs, measured alternately on fresh databases."""
        results: dict[str, list[dict]] = {a[0]: [], b[0]: []}
        for run in range(1, self.args.runs + 1):
            for label, extra in (a, b):
                log(f"{description}: {label}, run {run}/{self.args.runs}")
                results[label].append(self.measure("dispatch", "drain", *extra, **kw))
        return {"description": description, **{k: report.medians(v) for k, v in results.items()}}

    def async_sleep_rows(self) -> list[dict]:
        """The async check's rows: each system's command and its slots per process.

        ``slots`` (0: no cap) bounds a row's rate at W x slots / sleep, which
        sizes its backlog (``ASYNC_SLEEP_BUDGET_SECONDS``); ``extra`` and
        ``overrides`` go to its driver's ``drain`` phase.
        """
        args = self.args
        w, c, a = args.workers, args.concurrency, args.async_concurrency
        # What one django_dispatch worker may hold: C job threads, the control
        # loop, the listener and the asyncio executor (runtime/worker.py).
        pool = c + 3
        rows = [
            ("dispatch [threads]", "dispatch", c, [], {},
             f"rundispatch --concurrency {c}: an async job takes a job thread and a fresh "
             "event loop per attempt"),
            (report.ASYNC_OURS, "dispatch", a, ["--async-concurrency", str(a)], {},
             f"rundispatch --processes {w} --concurrency {c} --async-concurrency {a}: async "
             "jobs on one event loop per process, sync ones on its job threads"),
            ("pgqueuer [defaults, asyncpg+uvloop]", "pgqueuer", 0,
             ["--config", "defaults, asyncpg+uvloop"], {},
             "QueueManager.run() defaults: batch_size=10, no cap on tasks; asyncpg, uvloop "
             "(as `pgq run`)"),
            (f"pgqueuer [{a} slots, asyncpg+uvloop]", "pgqueuer", a,
             ["--config", "asyncpg+uvloop"], {"concurrency": a},
             f"batch_size={a // 2}, max_concurrent_tasks={a}; asyncpg, uvloop (as `pgq run`)"),
            ("procrastinate [async, defaults]", "procrastinate", 1, ["--config", "async"],
             {"concurrency": 1}, "async worker, concurrency=1 (its default), pool up to 3"),
            (f"procrastinate [async, {a}]", "procrastinate", a,
             ["--config", "async", "--pool-size", str(pool)], {"concurrency": a},
             f"async worker, concurrency={a}, pool up to {pool} connections (as one "
             "django_dispatch worker holds)"),
            ("chancy [async, defaults]", "chancy", 100, ["--config", "defaults, async"], {},
             "Worker(), Queue(executor=Async, eager_polling=True): concurrency 100 (its "
             "default)"),
            (f"chancy [async, {a}]", "chancy", a, ["--config", "async"], {"concurrency": a},
             f"Worker(), Queue(concurrency={a}, executor=Async, eager_polling=True)"),
        ]  # fmt: skip
        if args.async_baseline_ref:  # before/after in one run: right after ours
            baseline = f"{report.ASYNC_OURS} {args.async_baseline_sha}"
            rows.insert(2, (baseline, "dispatch", *rows[1][2:]))
        out = []
        for name, system, slots, extra, overrides, config in rows:
            if name in args.skip:
                continue
            jobs = args.async_sleep_jobs
            if slots:
                ceiling = w * slots * 1000 / args.async_sleep_ms  # jobs/s at best
                jobs = min(jobs, int(ceiling * ASYNC_SLEEP_BUDGET_SECONDS))
            python = args.async_baseline_python if name.startswith(f"{report.ASYNC_OURS} ") else ""
            out.append({"row": name, "system": system, "jobs": jobs, "extra": extra,
                        "overrides": overrides,
                        "config": config if system == "dispatch" and extra else
                        f"{w} processes x {config}",
                        "python": python})  # fmt: skip
        return out

    def async_sleep(self) -> dict:
        """Drain rates of async sleep jobs, every row ``runs`` times, interleaved.

        The same for every row: a backlog enqueued in bulk before the workers
        start (outside the timed drain), fresh workers and database per run,
        no warm-up. A row that fails is reported as such and not run again; the
        asyncio row is "not available" while rundispatch lacks the option.
        """
        args = self.args
        rows = [r for r in self.async_sleep_rows() if r["system"] in self.pythons]
        unavailable: dict[str, str] = {}
        python = self.pythons.get("dispatch", "")
        if python and not rundispatch_has(python, "--async-concurrency"):
            unavailable["dispatch [asyncio]"] = (
                "not available: the measured django_dispatch's rundispatch has no "
                "--async-concurrency"
            )
        results: dict[str, list[dict]] = {}
        for run in range(1, args.runs + 1):
            for row in rows:
                name = row["row"]
                if name in unavailable:
                    continue
                log(f"async sleep: {name}, {row['jobs']:,} jobs, run {run}/{args.runs}")
                sleep = ["--sleep-ms", repr(args.async_sleep_ms)]
                try:
                    result = self.measure(row["system"], "drain", *sleep, *row["extra"],
                                          python=row["python"], jobs=row["jobs"],
                                          **row["overrides"])  # fmt: skip
                except RuntimeError as e:
                    why = (str(e).strip().splitlines() or ["?"])[-1][:300]
                    unavailable[name] = f"failed: {why}"
                    results.pop(name, None)
                    log(f"async sleep: {name} FAILED; left out:\n{e}")
                    continue
                results.setdefault(name, []).append(result)
                log(f"  drain/s {result['drain_per_s']:,.0f}, "
                    f"steady {result.get('steady_drain_per_s') or 0:,.0f}")  # fmt: skip
        return {
            "description": (
                f"async def jobs that each await asyncio.sleep({args.async_sleep_ms:g} ms) and "
                f"return nothing, {args.async_sleep_jobs:,} per run (fewer where a row's slots "
                f"cap it: at most {ASYNC_SLEEP_BUDGET_SECONDS} s of work at its best rate), "
                "enqueued in bulk before the workers start"
            ),
            "rows": {
                r["row"]: {
                    "config": r["config"],
                    "jobs": r["jobs"],
                    **report.medians(results.get(r["row"], [])),
                }
                for r in rows
            },
            "unavailable": unavailable,
        }

    def extras(self) -> dict[str, dict]:
        args, out = self.args, {}
        if args.flatness:
            rows = f"{args.flatness_rows:,}"
            out["flatness"] = self.drain_pair(
                f"{args.jobs:,} jobs, with 0 vs {rows} succeeded jobs in the table",
                ("empty", []), ("full", ["--prefill-finished", str(args.flatness_rows)]),
            )  # fmt: skip
        if args.partitions:
            out["partitions"] = self.drain_pair(
                f"{args.jobs:,} jobs, unkeyed vs over {args.partition_keys:,} partition keys",
                ("unkeyed", []), ("keyed", ["--partition-keys", str(args.partition_keys)]),
            )  # fmt: skip
        if args.concurrency_limits:
            n = args.concurrency_keys
            out["concurrency"] = self.drain_pair(
                f"{args.jobs:,} jobs, unlimited vs over {n:,} keys with concurrency_limit=2",
                ("unkeyed", []), ("capped", ["--concurrency-keys", str(n)]),
            )  # fmt: skip
        if args.scale:
            deep = args.scale_backlog
            out["scale"] = self.drain_pair(
                f"the first {args.jobs:,} jobs of a 10,000 vs a {deep:,} pending backlog",
                ("shallow", ["--pending-backlog", str(max(10_000, args.jobs))]),
                ("deep", ["--pending-backlog", str(deep)]),
            )  # fmt: skip
            log(f"scale: one enqueue_many of {deep:,} rows")
            out["bulk_scale"] = self.measure("dispatch", "bulk_scale", jobs=deep)
        if args.fleet:
            self.background.append(self.wait_for_quiet())
            out["fleet"] = fleet.measure(args, self.pythons["dispatch"], log)
        if args.mixed_sizes:
            out["mixed_sizes"] = self.drain_pair(
                f"{args.jobs:,} jobs, no needs vs mixed sizes (20/500 MB) on --capacity workers",
                ("plain", []), ("mixed", ["--mixed-sizes"]),
            )  # fmt: skip
        if args.atomic:
            out.update(self.atomic())
        if args.map:
            out["map"] = self.drain_pair(
                f"{args.jobs:,} plain no-op jobs vs one workflow run whose step maps a no-op "
                f"child workflow over {args.jobs:,} inputs, from the workers' start until "
                "the run succeeds",
                ("plain", []), ("map", ["--map"]),
            )  # fmt: skip
        if args.async_sleep:
            out["async_sleep"] = self.async_sleep()
        if args.rss:
            log(f"rss: {args.rss_jobs:,} jobs")
            out["rss"] = self.measure("dispatch", "rss", jobs=args.rss_jobs)
            out["rss"]["description"] = (
                f"{args.workers} workers x {args.concurrency} draining {args.rss_jobs:,} jobs"
            )
        return out

    def atomic(self) -> dict[str, dict]:
        """``@task(atomic=True)`` against the same job without it: no-op jobs, which
        measure what the one transaction around the body costs, and the realistic
        job, whose INSERT, UPDATE and success then commit once instead of three times.
        Each pair alternates plain and atomic runs on fresh databases."""
        args, out = self.args, {}
        out["atomic_noop"] = self.drain_pair(
            f"{args.jobs:,} no-op jobs, plain vs @task(atomic=True)",
            ("plain", []), ("atomic", ["--atomic"]),
        )  # fmt: skip
        if args.realistic_jobs:
            n, realistic = args.realistic_jobs, ["--backlog", "realistic"]
            out["atomic_realistic"] = self.drain_pair(
                f"{n:,} realistic jobs (an ORM INSERT and UPDATE each), plain vs "
                "@task(atomic=True)",
                ("plain", realistic), ("atomic", [*realistic, "--atomic"]), jobs=n,
            )  # fmt: skip
        return out


def rundispatch_has(python: str, option: str) -> bool:
    """Whether the measured django_dispatch's ``rundispatch`` accepts ``option``."""
    project = BENCH_DIR / "dispatch_project"
    env = {**os.environ, "DATABASE_URL": "postgresql://localhost/unused"}  # --help connects not
    done = subprocess.run([python, str(project / "manage.py"), "rundispatch", "--help"],
                          cwd=project, env=env, capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        log(f"rundispatch --help failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return option in done.stdout


def machine(args, pg: PgServer, pythons: dict[str, str], background: list[float]) -> dict[str, str]:
    meminfo = Path("/proc/meminfo").read_text().split("\n")[0].split()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), platform.processor())  # fmt: skip
    settings = pg.settings()
    versions = {
        "Django": venvs.installed_version(pythons.get("dispatch", sys.executable), "Django")
    }
    for system, dist in [("django-tasks-db", "django-tasks-db"), ("procrastinate", "procrastinate"),
                         ("pgqueuer", "pgqueuer"), ("chancy", "chancy")]:  # fmt: skip
        if system in pythons:
            versions[dist] = venvs.installed_version(pythons[system], dist)
    if args.dispatch_ref:
        measured = f"commit {args.dispatch_sha} (--dispatch-ref {args.dispatch_ref})"
    else:
        tree = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=BENCH_DIR,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        measured = f"the working tree at {tree or 'unknown'}"
    return {
        "host": socket.gethostname(),
        "CPU": f"{cpu}, nproc {len(os.sched_getaffinity(0))}",
        "memory": f"{int(meminfo[1]) / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "PostgreSQL": settings.pop("server_version"),
        "PostgreSQL settings": ", ".join(f"{k}={v}" for k, v in settings.items()),
        "Python": platform.python_version(),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "django_dispatch measured": measured,
        "other load": (
            f"CPU busy just before each measurement (after waiting up to --quiet-wait "
            f"s for it to drop under 25%): median {median(background):.0%}, max "
            f"{max(background):.0%}; see also the 'other load' column"
            if background
            else "not sampled"
        ),
    }


def render(args, info: dict, rows: dict, extras: dict, failures: dict, started: float) -> str:
    command = shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    quick = " (QUICK smoke test: numbers too small to compare)" if args.quick else ""
    out = [
        f"# django_dispatch benchmark{quick}",
        "",
        f"{datetime.now():%Y-%m-%d %H:%M}, {time.time() - started:.0f} s. Command, from the "
        f"repository root:\n\n    {command}\n",
        f"{args.jobs:,} jobs per measurement, {args.bulk_jobs:,} per bulk enqueue, "
        f"{args.workers} worker processes x {args.concurrency} concurrency, median of "
        f"{args.runs} run(s); latency: {args.latency_rate:g} jobs/s for "
        f"{args.latency_seconds:g} s; idle CPU over {args.idle_seconds:g} s. A fresh database "
        "per system per run, on a throwaway PostgreSQL with default durability.",
        "",
        "## Results (medians)",
        "",
        report.results_table(rows),
        "",
        "Configurations: " + report.configurations_note(),
        "",
        "drain/s counts from the workers' start (start-up included); steady drain/s from the "
        "first finished job; CPU per job is counted over that steady part, for the worker "
        "processes and for the whole PostgreSQL server; 'other load' is the CPU used by "
        "anything else on the machine meanwhile, in % of one core (anything but ~0 means the "
        "numbers are depressed by other work). Latency: from enqueue() returning "
        "(committed) to the task "
        "function starting. Idle CPU: the busiest idle worker process, % of one core. RSS: "
        "VmHWM of the largest worker process.",
    ]
    me = rows.get("dispatch", {})
    if "orm_create_per_s" in me:
        out.append(
            "\nBare ORM baseline, interleaved with enqueues in rounds of 200: "
            f"`Row.objects.create()` of a job-wide row {report.fmt(me['orm_create_per_s'])}/s, "
            f"`noop.enqueue()` {report.fmt(me.get('paired_enqueue_per_s'))}/s, one per "
            "transaction each."
        )
    out += [
        "", "## django_dispatch ÷ each system", "", report.ratios_table(rows),
        "", "## Targets", "", report.targets_table(rows, extras),
        "", "## Extra checks (django_dispatch)", "", report.extras_section(extras),
    ]  # fmt: skip
    if "async_sleep" in extras:
        out += ["", "## Async sleep jobs", "", report.async_sleep_section(extras["async_sleep"])]
    if "fleet" in extras:
        out += ["", "## Fleet", "", fleet.section(extras["fleet"])]
    if failures:
        out += ["", "## Left out", ""]
        out += [f"- **{s}**: {msg.splitlines()[-1][:300]}" for s, msg in failures.items()]
    out += ["", "## Machine", ""] + [f"- {k}: {v}" for k, v in info.items()]
    return "\n".join(out) + "\n"


def main() -> None:
    args = parse_args()
    # SIGTERM unwinds like Ctrl-C, so that the throwaway server is always removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.time()
    pythons, failures = {}, {}
    for system in args.systems:
        try:
            if system == "dispatch" and args.dispatch_ref:
                pythons[system], args.dispatch_sha = venvs.dispatch_python(args.dispatch_ref)
            else:
                pythons[system] = venvs.python_for(system)
        except (RuntimeError, subprocess.CalledProcessError) as e:
            failures[system] = f"could not create its virtualenv: {e}"
            log(failures[system])
    if args.async_baseline_ref:
        args.async_baseline_python, args.async_baseline_sha = venvs.dispatch_python(
            args.async_baseline_ref
        )
    log(f"systems: {', '.join(pythons)} (peer configurations: {args.peer_configs}); "
        f"jobs={args.jobs} runs={args.runs} "
        f"W={args.workers} C={args.concurrency}")  # fmt: skip
    with PgServer() as pg:
        log(f"PostgreSQL on port {pg.port}: {pg.settings()}")
        bench = Bench(args, pg, pythons)
        runs = {} if args.checks_only else bench.standard(failures)
        extras = bench.extras() if "dispatch" in pythons else {}
        info = machine(args, pg, pythons, bench.background)
    rows = {system: report.medians(values) for system, values in runs.items()}
    text = render(args, info, rows, extras, failures, started)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.tag}" if args.tag else ""
    dated = args.output_dir / f"{datetime.now():%Y-%m-%d}-{info['host']}{suffix}.md"
    for path in (dated, args.output_dir / f"latest{suffix}.md"):
        path.write_text(text)
    dated.with_suffix(".json").write_text(json.dumps({"runs": runs, "extras": extras}, indent=1))
    print(text)
    log(f"written {dated} and latest{suffix}.md")


if __name__ == "__main__":
    main()
