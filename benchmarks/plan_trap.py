"""The wave's functions on a plan made while the job table was small, then large.

Each wave function forces a generic plan, made at a server session's first
call and kept for the session (migrations 0027, 0030, 0032). This plans them
in a fresh session on a small job table (``--small`` rows, default none; analyzed as
autovacuum leaves a table that was small), grows the table to ``--rows``
running and as many pending jobs, and times calls of 5, 16 and 1,000 ids in
that session; then the same with the plans made on the large table. The
functions' texts are those of the migration named by ``--texts`` (``0030``
or ``0032``), installed before each run, so one tree measures both. Time is
the backend's CPU (``/proc/<pid>/schedstat``), each call in a transaction
rolled back, fresh ids each call; medians. From the repository root:

    flock /tmp/bench.lock .venv/bin/python benchmarks/plan_trap.py --texts 0030 --texts 0032
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import sys
from pathlib import Path

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR), str(BENCH_DIR / "dispatch_project")]

from pgserver import PgServer  # noqa: E402
from wave_cost import backend_ns, setup  # noqa: E402

TEXTS = {
    "0030": ("0030_keyed_wave", ("FINISH", "LEASE", "LEASE_RUNNABLE", "FINISH_KEYED")),
    "0032": ("0032_wave_plans_by_id", ("FINISH", "LEASE", "LEASE_RUNNABLE", "FINISH_KEYED")),
}
INSERT = """
INSERT INTO django_dispatch_job (id, task_path, backend, queue_name, priority, args, kwargs,
    state, run_after, attempts, max_attempts, worker_lost_count, worker_id, lease_epoch, errors,
    worker_ids, enqueued_at, namespace, partition_yield, last_attempted_at)
SELECT g, 'bench.tasks.noop', 'default', 'default', 0, '[]', '{}', %s, now(), 1, 3, 0, 'w', 1,
    '[]', '[]', now(), '', false, now()
FROM generate_series(%s::bigint, %s::bigint) AS g
"""
SIZES = (5, 16, 1000)


def _array(values) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def finish(ids: list[int]) -> tuple[str, tuple]:
    """The finish of ``ids`` with usage records, as a wave sends it."""
    n = len(ids)
    return (
        "SELECT won FROM django_dispatch_finish_wave(%s::bigint[], %s::text[], %s::bigint[],"
        " %s::jsonb[], %s::boolean[], %s::float8[], %s::float8[], %s::float8[], 'h', 'succeeded')",
        (_array(ids), _array(["w"] * n), _array([1] * n), _array(['"null"'] * n),
         _array(["t"] * n), _array([0.1] * n), _array([0.1] * n), _array([1.0] * n)),
    )  # fmt: skip


def lease(ids: list[int]) -> tuple[str, tuple]:
    return ("SELECT django_dispatch_lease_wave(%s::bigint[], 'w2', 30, now())", (_array(ids),))


def runnable(ids: list[int]) -> tuple[str, tuple]:
    return (
        "SELECT leased FROM django_dispatch_lease_runnable(%s::bigint[], %s::text[], 'w2', 30,"
        " now(), '')",
        (_array(ids), _array(["NULL"] * len(ids))),
    )


CALLS = {"finish_wave": finish, "lease_wave": lease, "lease_runnable": runnable}


def install(url: str, texts: str) -> None:
    module, names = TEXTS[texts]
    migration = importlib.import_module(f"django_dispatch.migrations.{module}")
    with psycopg.connect(url, autocommit=True) as conn:
        for name in names:
            conn.execute(getattr(migration, name))


def scenario(url: str, rows: int, small: int, planned_small: bool) -> dict[tuple[str, int], float]:
    """ms of backend CPU per call, by (function, ids)."""
    admin = psycopg.connect(url, autocommit=True)
    admin.execute("TRUNCATE django_dispatch_job, django_dispatch_jobusage CASCADE")
    if small:
        admin.execute(INSERT, ("running", 10_000_000, 10_000_000 + small - 1))
    admin.execute("ANALYZE django_dispatch_job")
    session = psycopg.connect(url, autocommit=True)
    pid = session.execute("SELECT pg_backend_pid()").fetchone()[0]

    def call(name: str, ids: list[int]) -> float:
        sql, params = CALLS[name](ids)
        with session.transaction(force_rollback=True):
            before = backend_ns(pid)
            session.execute(sql, params).fetchall()
            return (backend_ns(pid) - before) / 1e6

    if planned_small:
        for name in CALLS:
            call(name, [-1])
    admin.execute(INSERT, ("running", 1, rows))
    admin.execute(INSERT, ("pending", rows + 1, 2 * rows))
    if not planned_small:
        admin.execute("ANALYZE django_dispatch_job")
        for name in CALLS:
            call(name, [-1])
    out = {}
    for name in CALLS:
        first = 1 if name == "finish_wave" else rows + 1
        for size in SIZES:
            times = []
            for _ in range(3 if size == 1000 else 9):
                times.append(call(name, list(range(first, first + size))))
                first += size
                if times[-1] > 2000:  # a trapped plan: one call says enough
                    break
            out[(name, size)] = statistics.median(times)
    session.close()
    admin.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", action="append", choices=sorted(TEXTS), required=True)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=0)
    parser.add_argument("--url", help="a database to migrate and use (default: a throwaway server)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(PgServer()).create_database("plan_trap")
        setup(url, 0)
        print(f"rows: {args.rows:,} running + {args.rows:,} pending; small: {args.small}")
        print("ms of server CPU per call (median); function@ids")
        for planned_small in (True, False):
            for texts in args.texts:
                install(url, texts)
                res = scenario(url, args.rows, args.small, planned_small)
                where = "planned small" if planned_small else "planned large"
                cells = "  ".join(f"{n}@{s}={v:.2f}" for (n, s), v in res.items())
                print(f"{texts} {where}: {cells}", flush=True)


if __name__ == "__main__":
    main()
