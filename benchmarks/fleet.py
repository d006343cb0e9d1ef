"""The fleet curve: 1 to 50 worker processes x 4 slots through PgBouncer, one machine.

``run.py --fleet`` calls ``measure``; ``section`` renders the report's table.
One server for the whole curve, as a small managed database is:
``max_connections=100``, PgBouncer in transaction mode in front of it with
``default_pool_size`` server connections at most (20, PgBouncer's default),
pg_stat_statements loaded (with planning time: the claim is planned on every
call, since prepared statements stay off behind a pooler) and
``log_lock_waits`` on with ``deadlock_timeout=100ms``. Each size gets a fresh
database and its own workers, started and settled before the first round
(``drivers/fleet.py`` says what each column measures); sizes run in order,
rounds of one size back to back, and the report gives each size's medians.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from statistics import median

from pgserver import PgBouncer, PgServer

BENCH_DIR = Path(__file__).resolve().parent
SIZES = "1,2,5,10,25,50"
SERVER_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track_planning": "on",
    "log_lock_waits": "on",
    "deadlock_timeout": "100ms",
}
#: Per size, the medians of these round results.
NUMBERS = [
    "per_s", "mid_per_s", "claim_p50_ms", "claim_p99_ms", "claim_server_ms",
    "claim_rows_per_call", "jobs_per_claim", "empty_claims_pct", "claim_server_ms_per_job",
    "server_ms_per_job", "lock_waits_per_sample", "lock_waits_max", "log_lock_waits",
    "server_sessions", "bouncer_waiting_max", "bouncer_waiting_mean", "bouncer_maxwait_ms",
    "active_backends_mean", "idle_in_transaction_mean", "worker_cpu_ms_per_job",
    "pg_cpu_ms_per_job", "bouncer_cpu_pct", "other_cpu_pct",
]  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fleet",
        action="store_true",
        help="dispatch: the fleet curve, --fleet-sizes worker processes x --fleet-slots "
        "through PgBouncer (transaction mode, LISTEN off) in front of a server with "
        "max_connections=100: throughput, claim latency, lock waits, server sessions",
    )
    p.add_argument("--fleet-sizes", default=SIZES, help="comma-separated process counts")
    p.add_argument("--fleet-slots", type=int, default=4, help="rundispatch --concurrency")
    p.add_argument("--fleet-jobs", type=int, default=20_000, help="no-op backlog per round")
    p.add_argument("--fleet-rounds", type=int, default=3, help="drains per size (medians)")
    p.add_argument("--fleet-pool", type=int, default=20, help="PgBouncer default_pool_size")
    p.add_argument("--fleet-listen", action="store_true",
                   help="workers on direct connections with LISTEN on, to a server with "
                   "max_connections=400, instead of through PgBouncer")  # fmt: skip
    p.add_argument("--fleet-trickle", type=float, default=0.0,
                   help="before the rounds, jobs one per transaction at this rate for 5 s onto "
                   "the idle fleet: claims per job (0: skip)")  # fmt: skip
    p.add_argument("--fleet-schedulers", type=int, default=0,
                   help="only this many workers tick cron, the others run with --no-scheduler "
                   "(0: every worker, the default)")  # fmt: skip


def measure(args: argparse.Namespace, python: str, log: Callable[[str], None]) -> dict:
    sizes = [int(s) for s in str(args.fleet_sizes).split(",") if s.strip()]
    listen = getattr(args, "fleet_listen", False)
    trickle = getattr(args, "fleet_trickle", 0.0)
    out: dict = {
        "description": (
            f"{args.fleet_jobs:,} no-op jobs per round, committed at once, drained by N "
            f"processes x {args.fleet_slots} slots through PgBouncer (transaction mode, "
            f"default_pool_size={args.fleet_pool}) in front of PostgreSQL with "
            f"max_connections=100, median of {args.fleet_rounds} round(s) per size"
            + (
                f"; only {args.fleet_schedulers} worker(s) tick cron (the others --no-scheduler)"
                if getattr(args, "fleet_schedulers", 0)
                else ""
            )
        ),
        "sizes": {},
    }
    with (
        PgServer(max_connections=400 if listen else 100, settings=SERVER_SETTINGS) as pg,
        PgBouncer(pg, pool_size=args.fleet_pool) as bouncer,
    ):
        for n in sizes:
            name = f"fleet_{n}"
            log(f"fleet: {n} x {args.fleet_slots}, {args.fleet_rounds} round(s)")
            db = pg.create_database(name)
            argv = [
                python, "-m", "drivers.fleet", "standard", "--db", db,
                "--worker-db", db if listen else bouncer.url(name), "--workers", str(n),
                "--concurrency", str(args.fleet_slots), "--jobs", str(args.fleet_jobs),
                "--rounds", str(args.fleet_rounds), "--server-log", str(pg.tmp / "server.log"),
                "--bouncer-admin", bouncer.url("pgbouncer"), "--bouncer-pid", str(bouncer.pid()),
                "--schedulers", str(getattr(args, "fleet_schedulers", 0)),
                "--trickle-rate", str(trickle), *(["--listen"] if listen else []),
            ]  # fmt: skip
            try:
                result = _run(argv)
            except RuntimeError as e:
                lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                out["sizes"][str(n)] = {"failed": (lines or ["?"])[-1][:300]}
                log(f"fleet, {n} FAILED:\n{e}")
                continue
            finally:
                pg.drop_database(name)
            result["median"] = {
                k: median(r[k] for r in result["rounds"] if r.get(k) is not None)
                for k in NUMBERS
                if any(r.get(k) is not None for r in result["rounds"])
            }
            idle = result.get("idle", {})
            result["median"]["idle_cpu_pct"] = sum(
                idle.get(k, 0.0) for k in ("worker_cpu_pct", "pg_cpu_pct", "bouncer_cpu_pct")
            )
            result["median"]["idle_statements_per_s"] = idle.get("statements_per_s", 0.0)
            if "trickle" in idle:
                t = idle["trickle"]
                log(
                    f"  trickle: {t['jobs']} jobs at {t['rate']:g}/s, one per transaction: "
                    f"{t['claims_per_job']:.1f} claims per job, {t['cpu_pct']:.0f}% of a core"
                )
            out["sizes"][str(n)] = result
            if result.get("jobs_not_run_once"):
                log(f"  {result['jobs_not_run_once']} jobs not run exactly once")
            m = result["median"]
            log(f"  {m.get('per_s', 0):,.0f} jobs/s (mid {m.get('mid_per_s', 0):,.0f}), claim "
                f"p50 {m.get('claim_p50_ms', 0):.1f} p99 {m.get('claim_p99_ms', 0):.1f} ms, "
                f"{m.get('server_sessions', 0):.0f} sessions")  # fmt: skip
    return out


def _run(argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(BENCH_DIR)}
    child = subprocess.Popen(argv, cwd=BENCH_DIR, env=env, text=True, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        stdout, stderr = child.communicate()
    except BaseException:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise
    if child.returncode:
        raise RuntimeError(f"fleet failed ({child.returncode}):\n{stderr[-4000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


#: The report's columns: (key, title, format).
COLUMNS = [
    ("per_s", "jobs/s", "{:,.0f}"),
    ("mid_per_s", "jobs/s 10-90%", "{:,.0f}"),
    ("claim_p50_ms", "claim p50 ms", "{:.1f}"),
    ("claim_p99_ms", "claim p99 ms", "{:.1f}"),
    ("claim_server_ms", "claim stmt server ms", "{:.2f}"),
    ("jobs_per_claim", "jobs/claim", "{:.1f}"),
    ("lock_waits_per_sample", "lock waits/sample", "{:.2f}"),
    ("log_lock_waits", "waits >100ms", "{:.0f}"),
    ("server_sessions", "server sessions", "{:.0f}"),
    ("idle_in_transaction_mean", "idle in txn (mean)", "{:.1f}"),
    ("bouncer_waiting_max", "clients waiting (max)", "{:.0f}"),
    ("worker_cpu_ms_per_job", "worker CPU ms/job", "{:.2f}"),
    ("pg_cpu_ms_per_job", "PG CPU ms/job", "{:.2f}"),
    ("bouncer_cpu_pct", "PgBouncer CPU %", "{:.0f}"),
    ("other_cpu_pct", "other load %", "{:.0f}"),
    ("idle_cpu_pct", "idle fleet CPU %", "{:.0f}"),
    ("idle_statements_per_s", "idle statements/s", "{:,.0f}"),
]


LEGEND = (
    "jobs/s: from the commit to the last success. Claim p50/p99: the worker's claim "
    "transaction (successes + claim + commit) as it sees it through PgBouncer. Jobs/claim: "
    "jobs per non-empty claim. Claim stmt server ms: the claim statement's planning + "
    "execution (pg_stat_statements). Lock waits/sample: backends waiting on a heavyweight "
    "lock, sampled every 0.1 s. Waits >100ms: log_lock_waits lines. Server sessions: the "
    "most client backends at once; idle in txn: of those, how many on average were idle in "
    "a transaction (held by a worker between its wave's statements). Clients waiting: "
    "PgBouncer's cl_waiting at most. Idle fleet: before the rounds, the whole fleet with "
    "nothing to do (workers + server + PgBouncer CPU, % of one core; statements/s)."
)


def _fmt(value, spec: str) -> str:
    return "—" if value is None else spec.format(value)


def section(fleet: dict) -> str:
    """The fleet curve: a row per size, then the 50-process ratio and what waited."""
    lines = [
        fleet["description"] + ". " + LEGEND,
        "",
        "| processes | " + " | ".join(c[1] for c in COLUMNS) + " |",
        "|---:|" + "---:|" * len(COLUMNS),
    ]
    best = 0.0
    for n, result in fleet.get("sizes", {}).items():
        if "failed" in result:
            lines.append(f"| {n} | failed: {result['failed']} |" + " |" * (len(COLUMNS) - 1))
            continue
        m = result["median"]
        best = max(best, m.get("per_s", 0.0))
        cells = [_fmt(m.get(k), spec) for k, _, spec in COLUMNS]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    top = max(fleet.get("sizes", {}), key=int, default=None)
    if top and best and "median" in fleet["sizes"][top]:
        ratio = fleet["sizes"][top]["median"]["per_s"] / best
        verdict = "within 20%" if ratio >= 0.8 else "MORE than 20% below"
        lines += ["", f"{top} processes: {ratio:.2f}x the best size's throughput ({verdict})."]
        odd = {n: r.get("jobs_not_run_once") for n, r in fleet["sizes"].items() if "rounds" in r}
        lines.append(
            "Jobs not run exactly once (attempts <> 1 or not succeeded), per size: "
            + ", ".join(f"{n}: {v if v is not None else '?'}" for n, v in odd.items())
            + "."
        )
        waits = fleet["sizes"][top]["rounds"][-1].get("wait_events", {})
        if waits:
            shown = ", ".join(f"{k} {v}" for k, v in waits.items())
            lines.append(f"Wait events of active backends at {top} processes (last round's "
                         f"samples): {shown}.")  # fmt: skip
        top_sql = fleet["sizes"][top]["rounds"][-1].get("top_statements", [])[:5]
        if top_sql:
            lines += ["", f"Statements by server time at {top} processes (last round):", ""]
            lines += [f"- {s['total_ms']:,.0f} ms, {s['calls']:,} calls: `{s['query']}`"
                      for s in top_sql]  # fmt: skip
    return "\n".join(lines)
