"""Async sleep jobs: interleaved A/B drains of django_dispatch commits, and what the server runs.

``run.py --async-sleep`` compares systems (and one baseline commit); this
compares versions of ours on the async check's job alone, quickly: every
variant drains the same backlog of ``async def`` jobs that each await
``asyncio.sleep(--sleep-ms)`` once per round, rounds interleave the variants,
medians are reported. From the repository root:

    flock /tmp/bench.lock .venv/bin/python benchmarks/async_ab.py main=main head=HEAD

A variant is ``label=ref[:DISPATCH json]`` (the commit's tree, ``git archive``, and
its ``DISPATCH`` settings, as ``ab.py``).
Each round: a fresh backlog of ``--jobs`` jobs (``enqueue_many``), then
``rundispatch --burst --processes W --concurrency C --async-concurrency A``
until it exits. Reported per variant: jobs per second from the workers'
start to their exit (start-up and shutdown included, as ``run.py``'s
drain/s), and CPU per job of the worker processes and of the whole
PostgreSQL server, each less what the same variant spends on an empty
queue. With ``--statements``, the server has pg_stat_statements loaded and
the last round's statements are listed per variant: calls and execution
time per job.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import ab
import psycopg
from pgserver import PgServer

BACKLOG = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from bench import tasks
from django_dispatch import enqueue_many
for start in range(0, {jobs}, 10_000):
    enqueue_many(tasks.async_sleep, [((), {{}})] * min(10_000, {jobs} - start))
"""
TOP_SQL = """
SELECT s.calls, s.total_exec_time, left(regexp_replace(s.query, '\\s+', ' ', 'g'), %s)
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = 'ab' ORDER BY s.total_exec_time DESC LIMIT %s
"""


def drain(args: argparse.Namespace, env: dict[str, str], server: PgServer, jobs: int) -> tuple:
    """One backlog drained: (seconds, worker CPU s, server CPU s)."""
    env = {**env, "DATABASE_URL": server.create_database("ab"),
           "BENCH_SLEEP_MS": repr(args.sleep_ms)}  # fmt: skip
    subprocess.run([sys.executable, "-c", BACKLOG.format(jobs=jobs)], env=env,
                   cwd=ab.PROJECT_DIR, check=True)  # fmt: skip
    if args.statements:
        with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
    seconds, worker_cpu, server_cpu = ab.burst(
        args, env, server, "--async-concurrency", str(args.async_concurrency)
    )
    with psycopg.connect(env["DATABASE_URL"]) as conn:
        left = conn.execute(ab.UNFINISHED_SQL).fetchone()[0]
        if left:
            print(f"  warning: {left:,} of {jobs:,} jobs left unfinished", flush=True)
        if args.statements and jobs:
            per_job = 1e3 / jobs
            for calls, ex, query in conn.execute(TOP_SQL, [args.width, args.top]):
                print(f"  {calls / jobs:7.3f} calls/job {ex * per_job:7.1f} us/job  {query}")
    return seconds, worker_cpu, server_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", help="label=ref[:DISPATCH json], as ab.py")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--async-concurrency", type=int, default=1000)
    parser.add_argument("--sleep-ms", type=float, default=50.0)
    parser.add_argument("--statements", action="store_true", help="pg_stat_statements per job")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--width", type=int, default=100)
    args = parser.parse_args()
    variants = [ab.parse_variant(v) for v in args.variants]
    settings = (
        {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}
        if args.statements
        else {}
    )
    with (
        tempfile.TemporaryDirectory(prefix="dispatch-async-ab-") as tmp,
        PgServer(settings=settings) as server,
    ):
        envs = ab.environments(variants, Path(tmp))
        statements, args.statements = args.statements, False
        idle = {label: drain(args, env, server, 0) for label, env in envs.items()}
        rows: dict[str, list[tuple]] = {}
        for round_ in range(1, args.rounds + 1):
            args.statements = statements and round_ == args.rounds
            for label, env in envs.items():
                spent = drain(args, env, server, args.jobs)
                seconds, worker, pg = (a - b for a, b in zip(spent, idle[label], strict=True))
                rows.setdefault(label, []).append(
                    (args.jobs / spent[0], 1000 * worker / args.jobs, 1000 * pg / args.jobs)
                )
                net = args.jobs / seconds  # less the idle start and stop
                print(f"round {round_} {label}: {rows[label][-1][0]:,.0f} jobs/s "
                      f"(net {net:,.0f})", flush=True)  # fmt: skip
    print(f"\n{args.jobs:,} async jobs sleeping {args.sleep_ms:g} ms, rundispatch --processes "
          f"{args.workers} --concurrency {args.concurrency} --async-concurrency "
          f"{args.async_concurrency} --burst, medians of {args.rounds} rounds")  # fmt: skip
    print("| variant | drain/s | worker CPU ms/job | PostgreSQL CPU ms/job |")
    print("|---|---:|---:|---:|")
    for label, values in rows.items():
        rate, worker, pg = (statistics.median(column) for column in zip(*values, strict=True))
        print(f"| {label} | {rate:,.0f} | {worker:.3f} | {pg:.3f} |")
    first = next(iter(rows))
    for label, values in rows.items():
        if label != first:
            ratios = [b[0] / a[0] for a, b in zip(rows[first], values, strict=True)]
            print(f"{label} / {first}: median per-round ratio {statistics.median(ratios):.2f}x "
                  f"({', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip


if __name__ == "__main__":
    main()
