"""Where a django_dispatch worker spends its CPU: one drain under py-spy.

From the repository root:

    .venv/bin/python benchmarks/profile_worker.py --dispatch-ref main
    .venv/bin/python benchmarks/profile_worker.py --realistic     # the working tree

It starts a throwaway PostgreSQL (as ``run.py`` does), queues ``--jobs``
no-op jobs in bulk on a fresh database and drains them with W
``rundispatch --concurrency C`` processes, through the same driver and
harness as the benchmark's drain (``drivers/dispatch.py``, ``harness.py``).
``py-spy record --format raw`` is attached to every worker process from the
first finished job to the last (``pyspy.py``: start-up and shutdown are left
out, as they are from the benchmark's CPU per job). With ``--realistic``, a
drain of ``--realistic-jobs`` realistic jobs (an ORM INSERT and UPDATE each)
follows.

For each drain it writes to ``benchmarks/results/``
``profile-<date>-<host>-<commit>-<job>.{svg,txt,collapsed.gz}``: the flame
graph, a text summary (the drain's numbers; self time by function, i.e. the
samples whose leaf frame is that function; total time by function; self time
by package area) and the collapsed stacks of all workers together, merged by
function (what the graph shows; flamegraph.pl and speedscope read them too).

What a sample counts (``--mode``): by default the thread that holds the GIL,
i.e. the Python code each worker runs; the summary says how much of the
measured worker CPU the samples cover (the rest is kernel time and C code
that releases the GIL). py-spy's own notion of an idle thread (``--mode
active``) was no help here: job threads woken for a moment, or waiting for
the GIL, were counted as running, and the samples added up to several times
the worker's CPU. The ``ms/job`` column is samples / rate / jobs drained
while sampling: each function's Python time per job.

py-spy is installed (into this interpreter's environment, with pip) when
missing. It pauses the workers for every sample (its default: whole stacks;
``--nonblocking`` does not, but then missed about a third of the GIL
holder's samples and tore stacks), and runs beside them on the machine's
cores, so a profiled drain is slower than an unprofiled one: compare
profiles with profiles, and rates with ``run.py``.

The name is not ``profile.py``: the drivers run with ``benchmarks/`` on their
path, where a ``profile`` module would shadow the standard library's (which
``cProfile`` imports).
"""

from __future__ import annotations

import argparse
import gzip
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import flame  # noqa: E402
import proc  # noqa: E402
import report  # noqa: E402
import run  # noqa: E402
import venvs  # noqa: E402
from pgserver import PgServer  # noqa: E402

#: What a sample counts (``--mode``), and py-spy's flag for it.
MODES = {
    "gil": "the thread holding the GIL, i.e. the Python code the interpreter runs (CPU "
    "spent in the kernel or in C code that releases the GIL, such as libpq's I/O, is not "
    "counted)",
    "active": "every thread py-spy does not see as idle (py-spy's default; threads that "
    "wait for the GIL, or wake from short waits, count as running)",
    "idle": "every thread, waiting or not: wall time, for where jobs wait",
}
MODE_FLAGS = {"gil": "--gil", "active": "", "idle": "--idle"}
JOB_LABELS = {
    "noop": "no-op jobs",
    "realistic": "realistic jobs (ORM INSERT + UPDATE each)",
    "async-sleep": "async sleep jobs (asyncio executor)",
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=50_000, help="no-op jobs to drain")
    p.add_argument("--realistic", action="store_true", help="also profile a realistic drain")
    p.add_argument("--realistic-jobs", type=int, default=5_000)
    p.add_argument(
        "--atomic",
        action="store_true",
        help="the no-op and realistic drains of their @task(atomic=True) twins",
    )
    p.add_argument(
        "--async-sleep",
        action="store_true",
        help="profile a drain of async jobs awaiting asyncio.sleep(--async-sleep-ms) on "
        "rundispatch --processes W --async-concurrency N instead of the no-op drain",
    )
    p.add_argument("--async-sleep-jobs", type=int, default=20_000)
    p.add_argument("--async-sleep-ms", type=float, default=50.0)
    p.add_argument("--async-concurrency", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2, help="worker processes (W)")
    p.add_argument("--concurrency", type=int, default=8, help="jobs in flight per process (C)")
    p.add_argument(
        "--dispatch-ref",
        default="",
        help="profile this git commit of "
        "django_dispatch (as run.py --dispatch-ref), not the working tree",
    )
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument(
        "--mode",
        choices=list(MODES),
        default="gil",
        help="which threads a sample counts: " + "; ".join(f"{k}: {v}" for k, v in MODES.items()),
    )
    p.add_argument("--native", action="store_true", help="py-spy --native: C frames too")
    p.add_argument(
        "--nonblocking",
        action="store_true",
        help="py-spy --nonblocking: do not pause the workers for each sample (less "
        "overhead, but torn stacks, and a third of the GIL holder's samples missed here)",
    )
    p.add_argument("--top", type=int, default=25, help="rows per table of the summary")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="wait up to this many seconds for other work on the machine to stop before each drain",
    )
    p.add_argument("--output-dir", type=Path, default=BENCH_DIR / "results")
    p.add_argument("--tag", default="", help="name part of the output files (default: the "
                   "commit measured)")  # fmt: skip
    return p.parse_args()


def ensure_pyspy() -> str:
    """The py-spy binary next to this interpreter, installed with pip when missing."""
    binary = Path(sys.executable).parent / "py-spy"
    if not binary.exists():
        run.log("py-spy missing: pip install py-spy")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=True)
    return str(binary)


def driver_args(args: argparse.Namespace, jobs: int) -> argparse.Namespace:
    """What ``run.run_driver`` passes to the driver (its ``DRIVER_OPTIONS``)."""
    return argparse.Namespace(
        jobs=jobs, bulk_jobs=0, workers=args.workers, concurrency=args.concurrency,
        idle_seconds=0, latency_seconds=0, latency_rate=1, realistic_jobs=0,
    )  # fmt: skip


def pyspy_options(args: argparse.Namespace) -> list[str]:
    flags = [(MODE_FLAGS[args.mode], True), ("--native", args.native),
             ("--nonblocking", args.nonblocking)]  # fmt: skip
    return ["--rate", str(args.rate), "--full-filenames"] + [f for f, on in flags if f and on]


def wait_for_quiet(seconds: float, threshold: float = 0.25) -> float:
    deadline = time.monotonic() + seconds
    while (busy := proc.machine_busy(2.0)) > threshold and time.monotonic() < deadline:
        time.sleep(3)
    return busy


def profile_drain(args, pg: PgServer, python: str, pyspy: str, job: str, rawdir: Path) -> dict:
    """One drain of ``job`` jobs under py-spy on a fresh database; its driver's result."""
    jobs = {"noop": args.jobs, "realistic": args.realistic_jobs}.get(job, args.async_sleep_jobs)
    extra = ["--backlog", job, *(["--atomic"] if args.atomic else [])]
    if job == "async-sleep":
        extra = ["--sleep-ms", repr(args.async_sleep_ms),
                 "--async-concurrency", str(args.async_concurrency)]  # fmt: skip
    busy = wait_for_quiet(args.quiet_wait)
    run.log(f"profiling a drain of {jobs:,} {JOB_LABELS[job]} (machine {busy:.0%} busy)")
    db = pg.create_database(f"profile_{job}")
    env = {"BENCH_PYSPY": pyspy, "BENCH_PYSPY_DIR": str(rawdir),
           "BENCH_PYSPY_ARGS": shlex.join(pyspy_options(args))}  # fmt: skip
    try:
        result = run.run_driver(python, "dispatch", "drain", db, driver_args(args, jobs),
                                *extra, env_extra=env)  # fmt: skip
    finally:
        pg.drop_database(f"profile_{job}")
    return {**result, "jobs": jobs, "machine_busy_before": busy}


def summary(args, what: str, job: str, result: dict, stacks: Counter, files: int) -> str:
    total = sum(stacks.values())
    steady = result.get("steady_jobs")
    # One sample stands for 1/rate s of a thread's time; per job of the steady part.
    per_sample = 1000 / args.rate / steady if steady else None
    cpu_ms = result.get("worker_cpu_ms_per_job")
    coverage = (
        f"{total * per_sample / cpu_ms:.0%} of the measured worker CPU"
        if per_sample and cpu_ms
        else "not comparable (no steady part measured)"
    )
    command = shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    number = {k: report.fmt(result.get(k), spec) for k, spec in (
        ("drain_per_s", "{:,.0f}"), ("steady_drain_per_s", "{:,.0f}"),
        ("worker_cpu_ms_per_job", "{:.3f}"), ("pg_cpu_ms_per_job", "{:.3f}"),
        ("other_cpu_pct", "{:.0f}"), ("steady_jobs", "{:,.0f}"))}  # fmt: skip
    head = [
        f"py-spy profile of django_dispatch's worker: {result['jobs']:,} {JOB_LABELS[job]}",
        f"{datetime.now():%Y-%m-%d %H:%M}, {what}; {args.workers} processes x "
        f"{args.concurrency}; py-spy record {' '.join(pyspy_options(args))}",
        f"command: {command}",
        "",
        f"drain/s {number['drain_per_s']} (steady {number['steady_drain_per_s']}, under "
        f"py-spy); CPU per job: worker {number['worker_cpu_ms_per_job']} ms, PostgreSQL "
        f"{number['pg_cpu_ms_per_job']} ms; other load {number['other_cpu_pct']}% of a core "
        f"(py-spy's own CPU included); machine {result['machine_busy_before']:.0%} busy "
        "before the drain.",
        f"{total:,} samples from {files} worker process(es) over the steady part of the "
        f"drain ({number['steady_jobs']} jobs); a sample counts {MODES[args.mode]}.",
        f"ms/job: samples / {args.rate} Hz / those jobs. All samples together: {coverage}.",
    ]
    sections = [
        ("Self time by function (leaf frame)", flame.self_by_function(stacks)),
        ("Total time by function (anywhere on the stack)", flame.total_by_function(stacks)),
        ("Self time by package area (the leaf's file, first two path parts)",
         flame.self_by_area(stacks)),
    ]  # fmt: skip
    out = head
    for title, counts in sections:
        rows = flame.table(counts, total, args.top, per_sample)
        out += ["", f"## {title}, top {args.top}", "", rows]
    return "\n".join(out) + "\n"


def write_outputs(args, what: str, tag: str, job: str, result: dict, rawdir: Path) -> Path:
    """Merge the workers' stacks; write the raw stacks, the SVG and the summary."""
    files = sorted(rawdir.glob("pyspy-*.raw"))
    lines = [line for f in files for line in f.read_text().splitlines() if line.strip()]
    if not lines:
        logs = "\n".join(f.read_text()[-1500:] for f in rawdir.glob("pyspy-*.log"))
        raise SystemExit(f"py-spy recorded nothing (too few jobs to reach a steady part?):\n{logs}")
    stacks = flame.parse(lines)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    base = args.output_dir / (
        f"profile-{datetime.now():%Y-%m-%d}-{socket.gethostname()}-{tag}-{job}"
    )
    merged = (";".join(stack) + f" {count}" for stack, count in stacks.most_common())
    with gzip.open(f"{base}.collapsed.gz", "wt") as out:
        out.write("\n".join(merged) + "\n")
    title = f"django_dispatch worker, {result['jobs']:,} {JOB_LABELS[job]}, {what}"
    base.with_suffix(".svg").write_text(flame.svg(stacks, title))
    text = summary(args, what, job, result, stacks, len(files))
    base.with_suffix(".txt").write_text(text)
    print(text)
    return base


def main() -> None:
    args = parse_args()
    pyspy = ensure_pyspy()
    if args.dispatch_ref:
        python, sha = venvs.dispatch_python(args.dispatch_ref)
        what = f"commit {sha} (--dispatch-ref {args.dispatch_ref})"
    else:
        python = sys.executable
        sha = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=BENCH_DIR,
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
        what = f"the working tree at {sha}"
    tag = (args.tag or sha) + ("-atomic" if args.atomic else "")
    jobs = ["noop", "realistic"] if args.realistic else ["noop"]
    if args.async_sleep:
        jobs = ["async-sleep"]
    with PgServer() as pg, tempfile.TemporaryDirectory(prefix="dispatch-profile-") as tmp:
        for job in jobs:
            rawdir = Path(tmp) / job
            result = profile_drain(args, pg, python, pyspy, job, rawdir)
            base = write_outputs(args, what, tag, job, result, rawdir)
            run.log(f"written {base}.svg, .txt and .collapsed.gz")


if __name__ == "__main__":
    main()
