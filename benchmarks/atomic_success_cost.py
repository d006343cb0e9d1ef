"""The server's cost of an atomic success, per job, against cheaper fenced writes.

An atomic job's success is its own transaction: the fenced UPDATE of its row
(which a plain job shares with a wave of others), then the COMMIT. This
measures, with one client on a throwaway server at default durability, the
server CPU and the wall time per job of:

- ``success``: ``django_dispatch_atomic_success`` and ``COMMIT`` in one query,
  as ``store.atomic_finish`` sends it (the usage record left out);
- ``marker``: what a success could cost if the job row's move were left to
  the next completion wave: the fence as a row lock on the job (``FOR NO KEY
  UPDATE``: no index entry, no new row version) and one INSERT into a narrow
  table, then ``COMMIT`` (a PL/pgSQL function too, planned once per session);
- ``insert``: one row into that narrow table, its own transaction: what any
  transaction that writes costs (its commit flushes the WAL);
- ``select 1``: ``BEGIN; SELECT 1; COMMIT``, a round trip that writes nothing;
- ``wave/16``: the same rows moved 16 at a time by one fenced UPDATE and
  ``COMMIT``, per job: roughly what the wave pays per success.

Blocks of each alternate (drift hits all alike). From the repository root:

    flock /tmp/bench.lock .venv/bin/python benchmarks/atomic_success_cost.py 44ad81c

The marker is a measurement, not a design that exists: moving the row later
changes what a reclaim, a cancel and the admin see between the commit and
that wave.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ab
import proc
import psycopg
from pgserver import PgServer
from psycopg import pq

SETUP = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from bench import tasks
from django_dispatch import enqueue_many
for start in range(0, {jobs}, 10_000):
    enqueue_many(tasks.noop, [((), {{}})] * min(10_000, {jobs} - start))
"""
RUNNING_SQL = """
UPDATE django_dispatch_job SET state = 'running', worker_id = 'w', lease_epoch = 1,
    attempts = 1, last_attempted_at = now(), lease_expires_at = now() + interval '1 hour'
"""
MARKER_SQL = """
CREATE TABLE bench_atomic_done (job_id bigint PRIMARY KEY, epoch bigint NOT NULL,
    return_value jsonb, finished_at timestamptz NOT NULL);
CREATE FUNCTION bench_atomic_marker(p_id bigint, p_worker text, p_epoch bigint, p_value jsonb)
RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM django_dispatch_job
    WHERE id = p_id AND (state = 'running') IS TRUE AND worker_id = p_worker
      AND lease_epoch = p_epoch
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost';
    END IF;
    INSERT INTO bench_atomic_done VALUES (p_id, p_epoch, p_value, statement_timestamp());
    RETURN 1;
END;
$$;
"""
WAVE = 16


def queries(kind: str, ids: list[int]) -> list[bytes]:
    if kind == "success":
        return [
            b"BEGIN; SELECT django_dispatch_atomic_success(%d::bigint, 'w'::text, 1::bigint,"
            b" NULL::jsonb, false, NULL::text, NULL::text, NULL::float8, NULL::float8,"
            b" NULL::float8); COMMIT" % i
            for i in ids
        ]
    if kind == "marker":
        return [
            b"BEGIN; SELECT bench_atomic_marker(%d::bigint, 'w'::text, 1::bigint, NULL::jsonb);"
            b" COMMIT" % i
            for i in ids
        ]
    if kind == "insert":  # a transaction with one small write: its commit flushes the WAL
        return [
            b"INSERT INTO bench_atomic_done VALUES (%d, 0, NULL, statement_timestamp())" % -i
            for i in ids
        ]
    if kind == "select 1":  # a transaction that writes nothing: no WAL flush at its commit
        return [b"BEGIN; SELECT 1; COMMIT" for _ in ids]
    return [
        b"UPDATE django_dispatch_job SET state = 'succeeded', finished_at = statement_timestamp(),"
        b" lease_expires_at = NULL WHERE id = ANY('{%s}'::bigint[]) AND state = 'running'"
        b" AND worker_id = 'w' AND lease_epoch = 1"
        % b",".join(b"%d" % i for i in ids[at : at + WAVE])
        for at in range(0, len(ids), WAVE)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ref", help="the commit whose migrations make the schema")
    parser.add_argument("--jobs", type=int, default=60_000, help="rows, split among the kinds")
    parser.add_argument("--blocks", type=int, default=6, help="alternating blocks per kind")
    args = parser.parse_args()
    kinds = ("success", "marker", "wave/16", "insert", "select 1")
    with tempfile.TemporaryDirectory() as tmp, PgServer() as server:
        env = ab.environments([("x", args.ref, "{}", "{}")], Path(tmp))["x"]
        env["DATABASE_URL"] = url = server.create_database("ab")
        subprocess.run([sys.executable, "-c", SETUP.format(jobs=args.jobs)], env=env,
                       cwd=ab.PROJECT_DIR, check=True)  # fmt: skip
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(RUNNING_SQL)
            conn.execute(MARKER_SQL)
            conn.execute("VACUUM ANALYZE django_dispatch_job")
            ids = [r[0] for r in conn.execute("SELECT id FROM django_dispatch_job ORDER BY id")]
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            pgconn = conn.pgconn
            per_block = len(ids) // (len(kinds) * args.blocks)
            results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
            at = 0
            for _ in range(args.blocks):
                for kind in kinds:
                    block, at = ids[at : at + per_block], at + per_block
                    sent = queries(kind, block)
                    cpu, wall = proc.cpu_seconds(backend), time.perf_counter()
                    for sql in sent:
                        if pgconn.exec_(sql).status not in (
                            pq.ExecStatus.COMMAND_OK,
                            pq.ExecStatus.TUPLES_OK,
                        ):
                            raise SystemExit(f"{kind}: {pgconn.error_message.decode()}")
                    wall, cpu = time.perf_counter() - wall, proc.cpu_seconds(backend) - cpu
                    results[kind].append((1e6 * cpu / len(block), 1e6 * wall / len(block)))
        print(f"\n{per_block:,} jobs per block, {args.blocks} blocks per kind, one client, "
              f"schema at {args.ref}; {server.settings()}")  # fmt: skip
        print("| per job | server CPU us (median) | wall us (median) |")
        print("|---|---:|---:|")
        for kind, values in results.items():
            cpu, wall = (statistics.median(column) for column in zip(*values, strict=True))
            print(f"| {kind} | {cpu:.0f} | {wall:.0f} |")


if __name__ == "__main__":
    main()
