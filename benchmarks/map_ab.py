"""The map check, interleaved: 10,000 plain no-op jobs against one run mapping a
no-op child over 10,000 inputs, for several commits, on one server.

From the repository root:

    .venv/bin/python benchmarks/map_ab.py before=71d1ea5 after=HEAD --rounds 3

Each round drains, on a fresh database of one throwaway PostgreSQL (default
durability, ``pgserver.py``), the plain backlog with the first variant's tree,
then the map with each variant's tree in turn; a variant's tree is its
commit's ``git archive`` (so that half-finished edits in the working tree play
no part), first on the path of the driver and of its workers. The drains are
the benchmark's own (``drivers/dispatch.py drain [--map]``, 2 workers x 8 by
default), as ``run.py --map`` runs them. Reported per drain: its rate, its
steady rate, the worker and PostgreSQL CPU per job (per child), the share of
the two cores other processes used meanwhile, and the load average before it;
then per variant the median of the rounds' map/plain ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ab import SITECUSTOMIZE, checkout
from pgserver import PgServer

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR / "dispatch_project"


def drain(args: argparse.Namespace, server: PgServer, tree: Path, hooks: Path, map_: bool) -> dict:
    url = server.create_database("mapab")
    env = {**os.environ, "PYTHONPATH": f"{hooks}:{tree}:{PROJECT_DIR}:{BENCH_DIR}"}
    argv = [sys.executable, "-m", "drivers.dispatch", "drain", "--db", url,
            "--jobs", str(args.jobs), "--workers", str(args.workers),
            "--concurrency", str(args.concurrency), *(["--map"] if map_ else [])]  # fmt: skip
    load = os.getloadavg()[0]
    out = subprocess.run(argv, env=env, cwd=BENCH_DIR, capture_output=True, text=True)
    server.drop_database("mapab")
    if out.returncode:
        raise SystemExit(f"drain failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {**result, "load": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", help="label=ref; the first one's tree drains plain")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    variants = [v.split("=", 1) for v in args.variants]
    rows: dict[str, list[dict]] = {"plain": [], **{label: [] for label, _ in variants}}
    with tempfile.TemporaryDirectory() as tmp, PgServer() as server:
        hooks = Path(tmp) / "hooks"
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
        trees = {label: checkout(ref, Path(tmp)) for label, ref in variants}
        print(f"server: {server.settings()}", flush=True)
        for round_ in range(1, args.rounds + 1):
            for label, map_ in [("plain", False), *((label, True) for label, _ in variants)]:
                tree = trees[variants[0][0] if label == "plain" else label]
                result = drain(args, server, tree, hooks, map_)
                rows[label].append(result)
                print(f"round {round_} {label}: {json.dumps(result)}", flush=True)
    print("\n| drain | drain/s | steady/s | worker CPU ms/job | PG CPU ms/job | share of plain |")
    print("|---|---:|---:|---:|---:|---:|")
    keys = ("drain_per_s", "steady_drain_per_s", "worker_cpu_ms_per_job", "pg_cpu_ms_per_job")
    for label, results in rows.items():
        rate, steady, worker, pg = (statistics.median(r[k] for r in results) for k in keys)
        share = ""
        if label != "plain":
            ratios = [
                r["drain_per_s"] / p["drain_per_s"]
                for r, p in zip(results, rows["plain"], strict=True)
            ]
            each = ", ".join(f"{x:.1%}" for x in ratios)
            share = f"{statistics.median(ratios):.1%} ({each})"
        print(f"| {label} | {rate:,.0f} | {steady:,.0f} | {worker:.2f} | {pg:.2f} | {share} |")


if __name__ == "__main__":
    main()
