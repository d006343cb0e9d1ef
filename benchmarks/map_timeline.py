"""Where a ``ctx.map`` drain's time goes: the set's creation, its children, the fan-in.

From the repository root:

    .venv/bin/python benchmarks/map_timeline.py d57f74a --rounds 2

Each round drains, on a fresh database of one throwaway PostgreSQL
(``pgserver.py``), the map check's run (one step mapping a no-op child
workflow over ``--jobs`` inputs, ``drivers/dispatch.py drain --map``, as
``map_ab.py`` and ``run.py --map`` drain it) with the commit's tree, then
reads the rows' timestamps: from the parent step's job starting, when the
children's jobs were inserted (the first one's ``enqueued_at``), when the
first child started (the set's transaction had committed), when the median
and the last child finished, and when the parent run succeeded. The drain's
own clock starts earlier, at the workers' start-up, as the plain drain's does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
from ab import SITECUSTOMIZE, checkout
from pgserver import PgServer

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR / "dispatch_project"
#: Epoch seconds of each point, the parent run being the one run with no parent.
TIMES_SQL = """
WITH p AS (SELECT id FROM django_dispatch_workflowrun WHERE parent_run_id IS NULL),
pj AS (SELECT j.* FROM django_dispatch_job j JOIN django_dispatch_workflowtask t ON t.job_id = j.id
       WHERE t.run_id = (SELECT id FROM p)),
cj AS (SELECT j.* FROM django_dispatch_job j JOIN django_dispatch_workflowtask t ON t.job_id = j.id
       JOIN django_dispatch_workflowrun r ON r.id = t.run_id
       WHERE r.parent_run_id = (SELECT id FROM p))
SELECT extract(epoch FROM (SELECT min(started_at) FROM pj)),
    extract(epoch FROM (SELECT min(enqueued_at) FROM cj)),
    extract(epoch FROM (SELECT min(started_at) FROM cj)),
    extract(epoch FROM (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY finished_at) FROM cj)),
    extract(epoch FROM (SELECT max(finished_at) FROM cj)),
    extract(epoch FROM (SELECT finished_at FROM django_dispatch_workflowrun
                        WHERE id = (SELECT id FROM p)))
"""
POINTS = ("parent step started", "children inserted", "first child started",
          "median child finished", "last child finished", "parent run succeeded")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ref", help="the commit whose tree drains")
    parser.add_argument("--jobs", type=int, default=10_000, help="the map's inputs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, PgServer() as server:
        hooks = Path(tmp) / "hooks"
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
        tree = checkout(args.ref, Path(tmp))
        env = {**os.environ, "PYTHONPATH": f"{hooks}:{tree}:{PROJECT_DIR}:{BENCH_DIR}"}
        for round_ in range(1, args.rounds + 1):
            url = server.create_database(f"timeline{round_}")
            argv = [sys.executable, "-m", "drivers.dispatch", "drain", "--db", url,
                    "--jobs", str(args.jobs), "--workers", str(args.workers),
                    "--concurrency", str(args.concurrency), "--map"]  # fmt: skip
            out = subprocess.run(argv, env=env, cwd=BENCH_DIR, capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"drain failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            with psycopg.connect(url) as conn:
                row = conn.execute(TIMES_SQL).fetchone()
            server.drop_database(f"timeline{round_}")
            assert row is not None and row[0] is not None, "the map's rows were not found"
            points = ", ".join(f"{name} +{float(t) - float(row[0]):.3f} s" for name, t in
                               zip(POINTS, row, strict=True))  # fmt: skip
            print(f"round {round_}: drain/s {result['drain_per_s']:,.0f} (steady "
                  f"{result['steady_drain_per_s']:,.0f}); {points}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
