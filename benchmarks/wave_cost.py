"""What one wave costs, by part: server CPU and the worker's Python, one session, no threads.

``ab.py`` measures whole drains on a shared machine, where the rate moves by
a third between two runs of the same commit. This measures one thing at a
time, in CPU rather than elapsed time: the wave's statement sent over and
over from one client, on a throwaway server (``pgserver.py``), its backend's
CPU read from ``/proc/<pid>/schedstat`` (nanoseconds, not clock ticks) and
the client's from ``time.thread_time``. From the repository root:

    flock /tmp/bench.lock .venv/bin/python benchmarks/wave_cost.py --size 16 --waves 2000

The working tree's package is the one imported. Parts (``--parts``):

- ``store``: ``store.wave.jobs_finish_many_and_claim``, each wave finishing
  the jobs the last one claimed and claiming ``--size`` more (the worker's
  steady state), usage records on: the whole wave, client and server.
- ``select1``: ``SELECT 1`` in autocommit: a round trip and an empty
  transaction.
- ``xid``: ``SELECT pg_current_xact_id()``: the same, its transaction
  committed as a writing one (a commit record flushed to the WAL).
- ``claim``: the same wave statement with no successes (a claim of
  ``--size``), then ``finish``: the successes alone (``_FINISH_ONLY``), two
  statements where ``store`` sends one.
- ``scan``: the claim's scan alone (its rows locked, none leased).

Each part's numbers are per wave and per job; the difference between two
parts is what the part between them costs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path[:0] = [str(REPO_DIR), str(BENCH_DIR), str(BENCH_DIR / "dispatch_project")]

from pgserver import PgServer  # noqa: E402


def backend_ns(pid: int) -> int:
    """The backend's CPU so far, in nanoseconds (the first field of schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


class Meter:
    """Client thread CPU and server backend CPU over a block of waves."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> Meter:
        self.server, self.client = backend_ns(self.pid), time.thread_time_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server = backend_ns(self.pid) - self.server
        self.client = time.thread_time_ns() - self.client


def setup(url: str, jobs: int) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchproject.settings"
    import django

    django.setup()
    from bench import tasks
    from django.core.management import call_command

    from django_dispatch import enqueue_many

    call_command("migrate", verbosity=0)
    for start in range(0, jobs, 10_000):
        enqueue_many(tasks.noop, [((), {})] * min(10_000, jobs - start))


def run_store(args: argparse.Namespace, pid: int) -> tuple[int, int, int]:
    """Waves of ``jobs_finish_many_and_claim``: (client ns, server ns, jobs)."""
    from django_dispatch.store.finish import Measured
    from django_dispatch.store.wave import WaveClaim, jobs_finish_many_and_claim

    claim = WaveClaim("wave-cost", args.size, 300.0)
    claimed = jobs_finish_many_and_claim([], db="default", claim=claim).claimed
    done = 0
    with Meter(pid) as m:
        for _ in range(args.waves):
            results = [(c.lease, None) for c in claimed]
            usage = {c.id: Measured(0.0001, 0.0001, 50.0, "host", "succeeded") for c in claimed}
            claimed = jobs_finish_many_and_claim(
                results, db="default", claim=claim, usage=usage or None
            ).claimed
            done += len(results)
    return m.client, m.server, done


def run_sql(args: argparse.Namespace, pid: int, part: str) -> tuple[int, int, int]:
    """Waves of one raw statement (``part``) through Django's connection: (client ns,
    server ns, jobs)."""
    from django.db import connection

    from django_dispatch.store.base import hot_cursor
    from django_dispatch.store.finish import Measured, finish_params
    from django_dispatch.store.sources.fused_pg import claim_sql
    from django_dispatch.store.wave import _FINISH_ONLY, _NO_USAGE, _WAVE, WaveClaim
    from django_dispatch.store.wave import jobs_finish_many_and_claim as wave

    claim_params = {"window": args.size, "worker_id": "wave-cost", "lease_seconds": 300.0,
                    "queues": None, "paused": None}  # fmt: skip
    wave_sql = claim_sql(queues=False, exclude=False, db="default", template=_WAVE[False])
    finish_sql = _FINISH_ONLY[False]
    scan_sql = claim_sql(
        queues=False,
        exclude=False,
        db="default",
        template="SELECT {fields}, now() FROM django_dispatch_claim_scan("
        "{namespace}, %(window)s::integer, %(queues)s::text[], %(paused)s::text[])",
    )
    claim = WaveClaim("wave-cost", args.size, 300.0)
    empty = finish_params([], None) | _NO_USAGE
    done = 0
    cursor = hot_cursor(connection)
    if part in ("select1", "xid"):
        # xid: a transaction that takes an id commits as a writing one (WAL flush)
        sql = "SELECT 1" if part == "select1" else "SELECT pg_current_xact_id()"
        with Meter(pid) as m:
            for _ in range(args.waves):
                cursor.execute(sql)
                cursor.fetchall()
        return m.client, m.server, 0
    if part == "scan":
        with Meter(pid) as m:
            for _ in range(args.waves):
                cursor.execute(scan_sql, claim_params)
                done += len(cursor.fetchall())
        return m.client, m.server, done
    # claim + finish: two statements per wave
    claimed = wave([], db="default", claim=claim).claimed
    client = server = 0
    for _ in range(args.waves):
        results = [(c.lease, None) for c in claimed]
        usage = {c.id: Measured(0.0001, 0.0001, 50.0, "host", "succeeded") for c in claimed}
        params = finish_params(results, usage)
        with Meter(pid) as m:
            cursor.execute(finish_sql, params)
            cursor.fetchall()
        if part == "finish":
            client, server = client + m.client, server + m.server
        with Meter(pid) as m:
            claimed = wave([], db="default", claim=claim).claimed
        if part == "claim":
            client, server = client + m.client, server + m.server
        done += len(results)
    del empty, wave_sql
    return client, server, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=16, help="jobs claimed per wave")
    parser.add_argument("--waves", type=int, default=2000, help="waves per part")
    parser.add_argument("--parts", default="select1,xid,store,scan,claim,finish")
    parser.add_argument("--repeat", type=int, default=1, help="passes over the parts")
    args = parser.parse_args()
    parts = args.parts.split(",")
    jobs = args.size * args.waves * (1 + sum(p in ("store", "claim", "finish") for p in parts))
    jobs = jobs * args.repeat + args.size * 4
    with PgServer() as server:
        setup(server.create_database("wave"), jobs)
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        print("| part | waves | jobs/wave | client us/wave | server us/wave | "
              "client us/job | server us/job |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|")
        for _ in range(args.repeat):
            for part in parts:
                if part == "store":
                    client, server, done = run_store(args, pid)
                else:
                    client, server, done = run_sql(args, pid, part)
                per = done / args.waves
                print(
                    f"| {part} | {args.waves} | {per:.1f} | {client / args.waves / 1e3:.1f} "
                    f"| {server / args.waves / 1e3:.1f} "
                    f"| {client / max(done, 1) / 1e3:.1f} | {server / max(done, 1) / 1e3:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
