"""Worker start-up, from the processes' launch to the first claimed and finished jobs.

``run.py``'s drain/s counts from the moment the worker processes are
launched, so the time a fresh worker takes to claim its first job is part of
it. This measures that time alone, the way the harness starts the workers:
W processes (``--workers``) of ``manage.py rundispatch --concurrency C``
(``drivers/dispatch.py``'s ``worker_argv``) launched at once on a backlog of
``--jobs`` no-ops already enqueued (and ``ANALYZE``d, as ``measure_drain``
does), on a throwaway PostgreSQL (``pgserver.py``). From the repository
root:

    .venv/bin/python benchmarks/startup.py base=main head=HEAD --rounds 7 --pgqueuer

A variant is ``label=ref`` (a commit's tree, as ``ab.py`` checks it out); each
round starts every variant once, interleaved, and the medians are reported,
in seconds from the launch:

- ``up``: the interpreter has started (the last of the W processes);
- ``setup``: ``django.setup()`` is done (all apps and models imported);
- ``command``: the management command starts (its module imported, its
  arguments parsed), before its checks;
- ``worker``: ``Worker.run`` starts (checks, migrations check, construction done);
- ``loop``: the control loop starts (registered, listening);
- ``claim`` / ``finish``: the first job's claim / success (the database's
  ``started_at`` / ``finished_at``, so the earliest of any process);
- ``first N``: the ``--first``-th job finished: the ramp to the steady rate.

Each commit's tree is compiled to bytecode first, as pip installs a
package and as ``run.py --dispatch-ref`` measures it: the benchmark's shell
sets ``PYTHONDONTWRITEBYTECODE``, under which a bare tree (and ``run.py``
without ``--dispatch-ref``, on the working tree) compiles ~200 modules from
source at every start, ~0.4 s that no installed site pays.

The process marks come from a ``sitecustomize`` put first on each process's
path, which wraps those functions as their modules are imported (no change
to the code measured). ``--pgqueuer`` adds PgQueuer at its defaults on
asyncpg and uvloop (``drivers/pgqueuer.py``, as ``run.py`` runs it, in its
own virtualenv): ``up``, ``loop`` (``QueueManager.run`` starts) and the
database marks, from its log table.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import venvs
from ab import BACKLOG, SETTINGS, SITECUSTOMIZE, checkout
from harness import ORDER_TABLE_SQL
from pgserver import PgServer

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR / "dispatch_project"
PGQUEUER = "pgqueuer [defaults, asyncpg+uvloop]"
MARKS = ["up", "setup", "command", "worker", "loop", "claim", "finish", "first"]
#: Each process's own phases, from one mark to the next in that process: on a
#: shared machine the launch-to-mark times drift by half a second from one
#: start to the next, mostly in the imports, and these show where a change
#: acted. The claim is that process's first (its worker id holds its pid).
PHASES = [("up", "setup"), ("setup", "command"), ("command", "worker"), ("worker", "loop"),
          ("loop", "claim")]  # fmt: skip
PROCESS_CLAIMS_SQL = """
SELECT worker_id, extract(epoch FROM min(started_at)) FROM django_dispatch_job
WHERE started_at IS NOT NULL GROUP BY worker_id
"""

#: Appended to ``ab.py``'s ``sitecustomize``: writes ``pid mark time`` lines to
#: ``$STARTUP_PROBE`` at interpreter start and around the functions below.
PROBE = """
import os as _os, time as _time
_OUT = _os.environ.get("STARTUP_PROBE")

def _mark(name):
    with open(_OUT, "a") as f:
        f.write(f"{_os.getpid()} {name} {_time.time():.6f}\\n")

_TARGETS = {
    "django": [("", "setup", "setup")],
    "django.core.management.base": [("BaseCommand", "execute", "command")],
    "django_dispatch.runtime.worker": [("Worker", "run", "worker")],
    "django_dispatch.runtime.producer": [("Producer", "run", "loop")],
    "pgqueuer.qm": [("QueueManager", "run", "loop")],
}

def _wrap(owner, attr, mark):
    inner = getattr(owner, attr)
    if inner.__code__.co_flags & 0x80:  # a coroutine function
        async def wrapper(*a, **k):
            _mark(mark + ":start")
            return await inner(*a, **k)
    else:
        def wrapper(*a, **k):
            _mark(mark + ":start")
            try:
                return inner(*a, **k)
            finally:
                _mark(mark + ":end")
    setattr(owner, attr, wrapper)

class _Probe:
    def find_spec(self, name, path=None, target=None):
        if name not in _TARGETS:
            return None
        import importlib.util
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader

        class Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                for cls, attr, mark in _TARGETS[name]:
                    owner = getattr(module, cls, None) if cls else module
                    if owner is not None and hasattr(owner, attr):
                        _wrap(owner, attr, mark)

        spec.loader = Loader()
        return spec

if _OUT:
    _mark("up")
    sys.meta_path.insert(0, _Probe())
"""

#: The database marks, as Unix times: first claim, first success, the N-th success.
DISPATCH_SQL = """
SELECT extract(epoch FROM min(started_at)), extract(epoch FROM min(finished_at)),
       (SELECT extract(epoch FROM finished_at) FROM django_dispatch_job
        WHERE state = 'succeeded' ORDER BY finished_at OFFSET %(n)s LIMIT 1)
FROM django_dispatch_job
"""
PGQUEUER_SQL = """
SELECT (SELECT extract(epoch FROM min(created)) FROM pgqueuer_log WHERE status = 'picked'),
       (SELECT extract(epoch FROM min(created)) FROM pgqueuer_log WHERE status = 'successful'),
       (SELECT extract(epoch FROM created) FROM pgqueuer_log WHERE status = 'successful'
        ORDER BY created OFFSET %(n)s LIMIT 1)
"""
DISPATCH_DONE_SQL = "SELECT count(*) FROM django_dispatch_job WHERE state = 'succeeded'"
PGQUEUER_DONE_SQL = "SELECT %(jobs)s - count(*) FROM pgqueuer"
PGQUEUER_SETUP = """
import argparse, sys
sys.path.insert(0, {bench!r})
from drivers.pgqueuer import PgQueuerDriver
args = argparse.Namespace(db={db!r}, config={config!r}, jobs={jobs}, concurrency={c},
                          sleep_ms=0.0, realistic_body="")
driver = PgQueuerDriver(args)
driver.setup()
driver.enqueue_bulk({jobs})
driver.close()
"""


class Variant:
    """One system at one version: how to fill a database and start its workers."""

    def __init__(self, label: str, env: dict[str, str], python: str, pgqueuer: bool) -> None:
        self.label, self.env, self.python, self.pgqueuer = label, env, python, pgqueuer

    def prepare(self, args: argparse.Namespace, url: str) -> None:
        env = {**self.env, "DATABASE_URL": url}
        if self.pgqueuer:
            script = PGQUEUER_SETUP.format(bench=str(BENCH_DIR), db=url, config=PGQUEUER[10:-1],
                                           jobs=args.jobs, c=args.concurrency)  # fmt: skip
            subprocess.run([self.python, "-c", script], env=env, cwd=BENCH_DIR, check=True)
        else:
            backlog = BACKLOG.format(jobs=args.jobs, deferred=0, task="noop",
                                     order_table=ORDER_TABLE_SQL)  # fmt: skip
            subprocess.run([self.python, "-c", backlog], env=env, cwd=PROJECT_DIR, check=True)

    def argv(self, args: argparse.Namespace) -> tuple[list[str], Path]:
        if self.pgqueuer:
            argv = [self.python, "-m", "drivers.pgqueuer", "worker", "--concurrency",
                    str(args.concurrency), "--sleep-ms", "0.0", "--realistic-body", "",
                    "--config", PGQUEUER[10:-1]]  # fmt: skip
            return argv, BENCH_DIR
        argv = [self.python, "manage.py", "rundispatch", "--concurrency", str(args.concurrency)]
        return argv, PROJECT_DIR


def hooks_dir(tmp: Path) -> Path:
    hooks = tmp / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE + PROBE)
    (hooks / "ab_settings.py").write_text(SETTINGS)
    return hooks


def variants(args: argparse.Namespace, tmp: Path) -> list[Variant]:
    hooks = hooks_dir(tmp)
    found = []
    for text in args.variants:
        label, _, ref = text.partition("=")
        if not label or not ref:
            raise SystemExit(f"a variant is label=ref, got {text!r}")
        tree = checkout(ref, tmp)
        # As pip installs it (and as run.py's --dispatch-ref measures it): with
        # bytecode. Under PYTHONDONTWRITEBYTECODE a bare tree would compile
        # ~200 modules from source at every start (~0.4 s of it).
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "django_dispatch")],
                       check=True)  # fmt: skip
        print(f"{label}: {ref} = {tree.name}", flush=True)
        env = {
            **os.environ,
            "PYTHONPATH": f"{hooks}:{tree}:{PROJECT_DIR}",
            "AB_DISPATCH": "{}",
            "AB_OPTIONS": "{}",
            "DJANGO_SETTINGS_MODULE": "ab_settings",
        }
        found.append(Variant(label, env, sys.executable, pgqueuer=False))  # fmt: skip
    if args.pgqueuer:
        env = {**os.environ, "PYTHONPATH": str(hooks)}
        found.append(Variant(PGQUEUER, env, venvs.python_for("pgqueuer"), pgqueuer=True))
    return found


def start_once(args: argparse.Namespace, variant: Variant, server: PgServer, tmp: Path) -> dict:
    """Launch the workers on a fresh backlog; each mark's seconds from the launch."""
    url = server.create_database("startup")
    variant.prepare(args, url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")
        probe = tmp / "probe.txt"
        probe.unlink(missing_ok=True)
        argv, cwd = variant.argv(args)
        env = {**variant.env, "DATABASE_URL": url, "STARTUP_PROBE": str(probe)}
        launched = time.time()
        with open(tmp / "workers.log", "a") as log:
            procs = [subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=log)
                     for _ in range(args.workers)]  # fmt: skip
        try:
            wait_for(conn, variant, args, procs)
        finally:
            stop(procs)
        done_sql = PGQUEUER_SQL if variant.pgqueuer else DISPATCH_SQL
        claim, finish, first = conn.execute(done_sql, {"n": args.first - 1}).fetchone()
        claims = [] if variant.pgqueuer else conn.execute(PROCESS_CLAIMS_SQL).fetchall()
    marks = process_marks(probe, args.workers)
    marks.update(claim=claim, finish=finish, first=first)
    found = {name: float(at) - launched for name, at in marks.items() if at is not None}
    found["phases"] = process_phases(probe, claims)
    return found


def process_phases(probe: Path, claims: list[tuple[str, float]]) -> list[dict[str, float]]:
    """Per worker process: each phase's seconds (``PHASES``)."""
    marks: dict[str, dict[str, float]] = {}
    for line in probe.read_text().splitlines() if probe.exists() else []:
        pid, name, at = line.split()
        if name == "up" or name.endswith(":start"):
            marks.setdefault(pid, {}).setdefault(name.removesuffix(":start"), float(at))
        elif name == "setup:end":
            marks.setdefault(pid, {})["setup"] = float(at)
    for worker_id, at in claims:
        pid = (worker_id or "").split(":")[1:2]
        if pid and pid[0] in marks:
            marks[pid[0]]["claim"] = float(at)
    return [{f"{a}-{b}": own[b] - own[a] for a, b in PHASES if a in own and b in own}
            for own in marks.values()]  # fmt: skip


def wait_for(conn, variant: Variant, args: argparse.Namespace, procs: list) -> None:
    """Until ``--first`` jobs have finished (a worker that exits early fails the run)."""
    sql = PGQUEUER_DONE_SQL if variant.pgqueuer else DISPATCH_DONE_SQL
    deadline = time.monotonic() + 60
    while conn.execute(sql, {"jobs": args.jobs}).fetchone()[0] < args.first:
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise SystemExit(f"{variant.label}: workers exited or stalled: "
                             f"{[p.poll() for p in procs]}")  # fmt: skip
        time.sleep(0.05)


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def process_marks(probe: Path, workers: int) -> dict[str, float | None]:
    """Each process mark's time in the last of the ``workers`` processes to reach it
    (a mark missing from a process: None). Only the worker processes' own marks
    count: the first of each process (a command re-executing itself marks again)."""
    seen: dict[str, dict[str, float]] = {}
    for line in probe.read_text().splitlines() if probe.exists() else []:
        pid, name, at = line.split()
        mark = name.removesuffix(":start")
        if name == "up" or name.endswith(":start"):
            seen.setdefault(mark, {}).setdefault(pid, float(at))
        elif name == "setup:end":
            seen.setdefault("setup", {})[pid] = float(at)
    marks: dict[str, float | None] = {}
    for mark in ("up", "setup", "command", "worker", "loop"):
        times = seen.get(mark, {})
        marks[mark] = max(times.values()) if len(times) >= workers else None
    return marks


def report(args: argparse.Namespace, rows: dict[str, list[dict]], settings: dict) -> None:
    print(f"\n{args.workers} worker processes x --concurrency {args.concurrency}, launched at "
          f"once on {args.jobs:,} queued no-ops; seconds from the launch, medians of "
          f"{args.rounds} interleaved rounds; {settings}")  # fmt: skip
    names = [m if m != "first" else f"first {args.first:,}" for m in MARKS]
    print("| variant | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(MARKS))
    for label, runs in rows.items():
        cells = []
        for mark in MARKS:
            values = [run[mark] for run in runs if mark in run]
            cells.append(f"{statistics.median(values):.3f}" if values else "")
        print(f"| {label} | " + " | ".join(cells) + " |")
    phase_names = [f"{a}-{b}" for a, b in PHASES]
    print("\nEach worker process's phases, seconds, medians over processes and rounds:")
    print("| variant | " + " | ".join(phase_names) + " | up-claim |")
    print("|---|" + "---:|" * (len(PHASES) + 1))
    for label, runs in rows.items():
        own = [phases for run in runs for phases in run.get("phases", []) if phases]
        if not own:
            continue
        cells = [statistics.median([p[n] for p in own if n in p] or [0.0]) for n in phase_names]
        total = statistics.median([sum(p.values()) for p in own if len(p) == len(PHASES)] or [0])
        print(f"| {label} | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {total:.3f} |")
    first = next(iter(rows))
    for label, runs in rows.items():
        if label == first:
            continue
        for mark in ("claim", "finish", "first"):
            deltas = [b[mark] - a[mark] for a, b in zip(rows[first], runs, strict=True)]
            print(f"{label} - {first}, {mark}: median per-round difference "
                  f"{statistics.median(deltas):+.3f} s "
                  f"({', '.join(f'{d:+.2f}' for d in deltas)})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", help="label=ref")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--first", type=int, default=1_000,
                        help="also time until this many jobs have finished")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pgqueuer", action="store_true",
                        help=f"also start {PGQUEUER} (its own virtualenv)")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dispatch-startup-") as tmp, PgServer() as server:
        found = variants(args, Path(tmp))
        rows: dict[str, list[dict]] = {v.label: [] for v in found}
        for variant in found:  # not counted: compiles each tree's bytecode, warms the caches
            start_once(args, variant, server, Path(tmp))
        for round_ in range(1, args.rounds + 1):
            for variant in found:
                marks = start_once(args, variant, server, Path(tmp))
                rows[variant.label].append(marks)
                print(f"round {round_} {variant.label}: " + ", ".join(
                    f"{m} {marks[m]:.3f}" for m in MARKS if m in marks), flush=True)  # fmt: skip
                for own in marks["phases"]:
                    print("  " + ", ".join(f"{k} {v:.3f}" for k, v in own.items()), flush=True)
        report(args, rows, server.settings())


if __name__ == "__main__":
    main()
