"""What the server runs per job, by statement: one commit's drains under pg_stat_statements.

``ab.py`` says how fast and at what CPU; this says where the server's time
goes, per job, for each task of ``--tasks`` (by default the atomic check's
four). From the repository root:

    flock /tmp/bench.lock .venv/bin/python benchmarks/ab_statements.py 0be530d \\
        --jobs 5000 --tasks noop,noop_atomic,realistic,realistic_atomic

Each task: a fresh backlog drained by ``rundispatch --burst`` exactly as
``ab.py`` drains it (its ``drain``), on a throwaway server with
pg_stat_statements loaded (``track = all``: the statements inside PL/pgSQL
functions too, each on its own line; ``track_planning`` on), reset before
the drain. Printed per statement: calls per job, and execution and planning
time per job. Those are elapsed times, not CPU: on a busy machine a
statement's time includes the waits for a core and for locks. Then the
database's commits and rollbacks since it was created (the backlog's own
few included). The server is not the one ``ab.py`` measures CPU on: read
rates and CPU from ``ab.py``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import ab
import psycopg
from pgserver import PgServer

SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_planning": "on",
}
TOP_SQL = """
SELECT s.calls, s.total_exec_time, s.total_plan_time,
       left(regexp_replace(s.query, '\\s+', ' ', 'g'), %s)
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = 'ab'
ORDER BY s.total_exec_time + s.total_plan_time DESC
LIMIT %s
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ref", help="the commit whose tree the drains run")
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--tasks", default=",".join(ab.TASKS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--top", type=int, default=12, help="statements listed per task")
    parser.add_argument("--width", type=int, default=90, help="characters of each statement")
    args = parser.parse_args()
    args.deferred = 0  # ab.drain's backlog: no deferred jobs
    tasks = args.tasks.split(",")
    unknown = sorted(set(tasks) - set(ab.TASKS))
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}: choose among {', '.join(ab.TASKS)}")
    with tempfile.TemporaryDirectory() as tmp, PgServer(settings=SETTINGS) as server:
        env = ab.environments([("x", args.ref, "{}", "{}")], Path(tmp))["x"]
        admin = server.create_database("admin")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        for task in tasks:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
            seconds, worker_cpu, server_cpu = ab.drain(args, env, server, args.jobs, task)
            per_job = 1e3 / args.jobs
            print(
                f"\n{task} at {args.ref}: {args.jobs / seconds:,.0f} jobs/s, CPU per job: "
                f"worker {worker_cpu * per_job:.3f} ms, PostgreSQL {server_cpu * per_job:.3f} ms"
            )
            print("| calls/job | exec us/job | plan us/job | statement |")
            print("|---:|---:|---:|---|")
            with psycopg.connect(admin, autocommit=True) as conn:
                for calls, ex, plan, query in conn.execute(TOP_SQL, [args.width, args.top]):
                    query = query.replace("|", "\\|")
                    print(
                        f"| {calls / args.jobs:.3f} | {ex * per_job:.1f} "
                        f"| {plan * per_job:.1f} | `{query}` |"
                    )
                commits, rollbacks = conn.execute(
                    "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = 'ab'"
                ).fetchone()
            print(f"commits {commits:,}, rollbacks {rollbacks:,} (since the database was created)")


if __name__ == "__main__":
    main()
