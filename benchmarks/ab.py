"""Interleaved A/B drains of django_dispatch commits and settings, on one server.

``run.py`` compares systems; this compares versions of ours, quickly, with
the noise of a shared machine in mind: every variant drains the same no-op
backlog once per round, rounds interleave the variants (drift hits them all
alike), and the medians are reported. From the repository root:

    .venv/bin/python benchmarks/ab.py base=6d93968 head=HEAD \\
        'prepared=HEAD:{}:{"prepare_threshold":1}' 'usage-off=HEAD:{"USAGE":"off"}'

A variant is ``label=ref[:DISPATCH json[:database OPTIONS json]]``: the
commit's tree (``git archive``, so that half-finished edits play no part) is
imported first by the driver and the workers, the JSON merged into the
benchmark project's ``DISPATCH`` and ``DATABASES["default"]["OPTIONS"]``.
Each round: a fresh backlog of ``--jobs`` no-ops (``enqueue_many``; with
``--deferred N``, N more deferred by a day, which stay behind), then
``rundispatch --processes W --concurrency C --burst`` until it exits. Reported
per variant: jobs per second of the drain and the CPU per job of the worker
processes and of the whole PostgreSQL server, each less what the same
variant spends on an empty queue (start-up and shutdown). The server is a
throwaway one with PostgreSQL's default durability (``pgserver.py``).

``--tasks`` drains other jobs than the no-op, each variant once per task per
round, e.g. ``--tasks noop,noop_atomic,realistic,realistic_atomic``: the
atomic check's ratios (``@task(atomic=True)`` against the same job without
it) of several commits within one run. ``realistic`` jobs each INSERT and
UPDATE a row of ``bench_order`` through the ORM (``bench.orders``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import proc
import psycopg
from harness import ORDER_TABLE_SQL
from pgserver import PgServer

BENCH_DIR = Path(__file__).resolve().parent
TASKS = ("noop", "noop_atomic", "realistic", "realistic_atomic")
UNFINISHED_SQL = (
    "SELECT count(*) FROM django_dispatch_job WHERE state NOT IN ('succeeded', 'scheduled')"
)
REPO_DIR = BENCH_DIR.parent
PROJECT_DIR = BENCH_DIR / "dispatch_project"
#: Put first on the path of every process: it drops the editable install's
#: import hook, which would otherwise import the working tree's package.
SITECUSTOMIZE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in repr(f)]
"""
SETTINGS = """import json, os
from benchproject.settings import *  # noqa: F403
DISPATCH = {**DISPATCH, **json.loads(os.environ["AB_DISPATCH"])}  # noqa: F405
OPTIONS = DATABASES["default"].setdefault("OPTIONS", {})  # noqa: F405
OPTIONS.update(json.loads(os.environ["AB_OPTIONS"]))
"""
BACKLOG = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from bench import atomic_tasks, tasks
from django.db import connection
from django_dispatch import enqueue_many
connection.cursor().execute('''{order_table}''')
task = {{"noop": tasks.noop, "noop_atomic": atomic_tasks.noop_atomic,
        "realistic": tasks.realistic, "realistic_atomic": atomic_tasks.realistic_atomic}}[{task!r}]
for start in range(0, {jobs}, 10_000):
    seqs = range(start, min({jobs}, start + 10_000))
    enqueue_many(task, [((seq,) if "realistic" in {task!r} else (), {{}}) for seq in seqs])
from datetime import timedelta
from django.utils import timezone
later = tasks.noop.using(run_after=timezone.now() + timedelta(days=1))
for start in range(0, {deferred}, 10_000):
    enqueue_many(later, [((), {{}})] * min(10_000, {deferred} - start))
"""


def parse_variant(text: str) -> tuple[str, str, str, str]:
    label, sep, rest = text.partition("=")
    ref, _, settings = rest.partition(":")
    if not sep or not label or not ref:
        raise SystemExit(f"a variant is label=ref[:DISPATCH json[:OPTIONS json]], got {text!r}")
    decoder = json.JSONDecoder()
    dispatch, options, at = "{}", "{}", 0
    if settings:  # two JSON objects, a colon between them (a typo fails here, not in a worker)
        _, at = decoder.raw_decode(settings)
        dispatch = settings[:at]
        if settings[at:]:
            options = settings[at:].removeprefix(":")
            decoder.decode(options)
    return label, ref, dispatch, options


def checkout(ref: str, into: Path) -> Path:
    """The tree of commit ``ref`` (extracted once per commit)."""
    sha = subprocess.run(
        ["git", "-C", str(REPO_DIR), "rev-parse", "--short", f"{ref}^{{commit}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    tree = into / sha
    if not tree.exists():
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO_DIR), "archive", sha], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def drain(
    args: argparse.Namespace, env: dict[str, str], server: PgServer, jobs: int, task: str = "noop"
) -> tuple:
    """One backlog of ``jobs`` ``task`` jobs drained: (seconds, worker CPU s, server CPU s)."""
    env = {**env, "DATABASE_URL": server.create_database("ab")}
    backlog = BACKLOG.format(jobs=jobs, deferred=args.deferred if jobs else 0, task=task,
                             order_table=ORDER_TABLE_SQL)  # fmt: skip
    run = [sys.executable, "-c", backlog]
    subprocess.run(run, env=env, cwd=PROJECT_DIR, check=True)
    seconds, worker_cpu, server_cpu = burst(args, env, server)
    with psycopg.connect(env["DATABASE_URL"]) as conn:  # a burst that ended early: say so
        left = conn.execute(UNFINISHED_SQL).fetchone()[0]
    if left:
        print(f"  warning: {left:,} of {jobs:,} {task} jobs left unfinished", flush=True)
    return seconds, worker_cpu, server_cpu


def burst(
    args: argparse.Namespace, env: dict[str, str], server: PgServer, *more: str
) -> tuple[float, float, float]:
    """``rundispatch --burst`` over the backlog in place, ``more`` its extra flags:
    (seconds, worker CPU s, server CPU s)."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    server_cpu = proc.cpu_seconds(postmaster, reaped=True)
    argv = [sys.executable, "manage.py", "rundispatch", "--burst", "--processes",
            str(args.workers), "--concurrency", str(args.concurrency), *more]  # fmt: skip
    started = time.monotonic()
    worker = subprocess.Popen(argv, env=env, cwd=PROJECT_DIR, stdout=subprocess.DEVNULL)
    worker_cpu = 0.0
    while worker.poll() is None:  # the children's CPU, read while they live
        worker_cpu = max(worker_cpu, proc.cpu_seconds(worker.pid))
        time.sleep(0.02)
    seconds = time.monotonic() - started
    if worker.returncode:
        raise SystemExit(f"rundispatch exited with {worker.returncode}")
    return seconds, worker_cpu, proc.cpu_seconds(postmaster, reaped=True) - server_cpu


def environments(variants: list[tuple[str, str, str, str]], tmp: Path) -> dict[str, dict]:
    """Each variant's environment: its commit's tree first on the path, its settings."""
    hooks = tmp / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (hooks / "ab_settings.py").write_text(SETTINGS)
    envs = {}
    for label, ref, dispatch, options in variants:
        print(f"{label}: {ref} = {checkout(ref, tmp).name}", flush=True)
        envs[label] = {
            **os.environ,
            "PYTHONPATH": f"{hooks}:{checkout(ref, tmp)}:{PROJECT_DIR}",
            "AB_DISPATCH": dispatch,
            "AB_OPTIONS": options,
            "DJANGO_SETTINGS_MODULE": "ab_settings",
        }
    return envs


def report(args: argparse.Namespace, rows: dict[str, list[tuple]], settings: dict) -> None:
    print(
        f"\n{args.jobs:,} jobs of each of {', '.join(args.tasks)} "
        f"(and {args.deferred:,} no-ops deferred by a day), "
        f"{args.workers} x {args.concurrency}, "
        f"medians of {args.rounds} interleaved rounds; {settings}"
    )
    print("| variant | drain/s | worker CPU ms/job | PostgreSQL CPU ms/job |")
    print("|---|---:|---:|---:|")
    for label, values in rows.items():
        rate, worker, pg = (statistics.median(column) for column in zip(*values, strict=True))
        print(f"| {label} | {rate:,.0f} | {worker:.3f} | {pg:.3f} |")
    # Each variant against the first (same task): medians of the per-round
    # ratios, each round's drains having run back to back.
    first = next(iter(rows)).split(" ")[0]
    for row, values in rows.items():
        label, _, task = row.partition(" ")
        if label == first:
            continue
        base = rows[f"{first} {task}" if task else first]
        per_round = [tuple(a / b for a, b in zip(v, w, strict=True)) for v, w in
                     zip(values, base, strict=True)]  # fmt: skip
        rate, worker, pg = (statistics.median(column) for column in zip(*per_round, strict=True))
        print(f"{row} / {first}: median per-round ratios: drain/s {rate:.3f}x, "
              f"worker CPU/job {worker:.3f}x, PostgreSQL CPU/job {pg:.3f}x "
              f"(drain/s {', '.join(f'{r[0]:.2f}' for r in per_round)})")  # fmt: skip
    # The atomic check's ratios, per variant: medians of the per-round ratios
    # (a round's two drains ran back to back, so drift cancels out of each).
    for row, values in rows.items():
        plain = rows.get(row.removesuffix("_atomic"))
        if row.endswith("_atomic") and plain:
            ratios = [a[0] / b[0] for a, b in zip(values, plain, strict=True)]
            print(f"{row} / plain: median per-round ratio {statistics.median(ratios):.2f}x "
                  f"({', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", help="label=ref[:DISPATCH json[:OPTIONS json]]")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--tasks", default="noop",
        help=f"comma-separated, each drained by every variant every round: {', '.join(TASKS)}",
    )  # fmt: skip
    parser.add_argument(
        "--deferred", type=int, default=0,
        help="also enqueue this many no-ops deferred by a day, present through the drain",
    )  # fmt: skip
    args = parser.parse_args()
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not args.tasks or set(args.tasks) - set(TASKS):
        parser.error(f"--tasks: choose from {', '.join(TASKS)}, got {args.tasks}")
    variants = [parse_variant(v) for v in args.variants]
    with tempfile.TemporaryDirectory(prefix="dispatch-ab-") as tmp, PgServer() as server:
        envs = environments(variants, Path(tmp))
        idle = {label: drain(args, env, server, 0) for label, env in envs.items()}
        rows: dict[str, list[tuple]] = {}
        for round_ in range(1, args.rounds + 1):
            for label, env in envs.items():
                for task in args.tasks:
                    row = label if args.tasks == ["noop"] else f"{label} {task}"
                    spent = drain(args, env, server, args.jobs, task)
                    seconds, worker, pg = (a - b for a, b in zip(spent, idle[label], strict=True))
                    rows.setdefault(row, []).append((args.jobs / seconds, 1000 * worker / args.jobs,
                                                     1000 * pg / args.jobs))  # fmt: skip
                    print(f"round {round_} {row}: {rows[row][-1][0]:,.0f} jobs/s", flush=True)
        report(args, rows, server.settings())


if __name__ == "__main__":
    main()
