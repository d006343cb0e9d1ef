"""History at scale: the operator's reads and the retention purge next to millions of finished jobs.

One throwaway PostgreSQL server (``pgserver.PgServer``), four states of the tables, each a
database of its own:

* **empty**: the tables just migrated;
* **page**: one page of rows and no history: 100 failed jobs of one queue and
  task in the last hour, their dead letters and 100 stuck workflow runs, so
  that every list read (filtered or not) shows a full page and every count
  is exact; what a page costs to build and render, apart from the history;
* **current**: what a busy site has besides its history: a live backlog
  (pending, deferred, running jobs) and the last hour's finished jobs, at the
  rate the history was made (``--rows`` over 30 days);
* **history**: the same, plus ``--rows`` finished jobs (default 10,000,000)
  over the 30 days before, with their dead letters (one per failed job) and
  one finished workflow run per ten jobs.

The history is made on the server in one ``INSERT … SELECT generate_series``
per table, ids growing with time as the site's would, with the job table's
secondary indexes dropped meanwhile and built again after (as a restore
would), then ``VACUUM ANALYZE``. Each read (the admin's job and dead letter
lists, the console, the list functions, ``dispatch_status``) is timed warm,
median of ``--runs``, at each state, interleaved (each run at every state in
turn, so that the machine's load moves them alike); the target is the
history's time within 2x of the empty table's, and the report sets it beside
the page's (a list read on the empty table returns nothing) and the current
table's (the same live work without the history).

Then the purge: a worker (``rundispatch``, its own retention off) drains a
backlog of no-op jobs while ``dispatch_purge`` deletes the history past
``JOB_RETENTION`` (7 days for succeeded and cancelled jobs: about three
quarters of it), in windows alternating with windows without a purge, one
per ``--pauses`` value of ``PURGE_PAUSE``; the claim rate with the purge at
the default pause must be at least 80% of the rate without.

    .venv/bin/python benchmarks/history.py             # 10,000,000 rows, many minutes
    .venv/bin/python benchmarks/history.py --quick     # 200,000 rows, a smoke test

To look into one read (``EXPLAIN`` on the built tables, a change timed again)
without building the history each time: ``--keep DIR`` builds the server in
``DIR`` and leaves it there (the purge is not run, so the history stays
whole); ``--reuse DIR`` starts that server again, applies this checkout's
migrations (a schema change is timed on the history built before it), times the reads, then
the purge unless ``--no-purge`` (the purge deletes most of the history: that
server is not reused after it), ``--reads`` picks some of the reads by name:

    .venv/bin/python benchmarks/history.py --keep /tmp/history-10m --tag keep
    .venv/bin/python benchmarks/history.py --reuse /tmp/history-10m --reads count --no-purge
    .venv/bin/python benchmarks/history.py --reuse /tmp/history-10m     # the last use
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
# The checkout's own django_dispatch, the one the report's commit names (not
# whichever the virtualenv installed, such as another worktree's).
sys.path.insert(0, str(BENCH_DIR.parent))

from drivers import django_setup  # noqa: E402
from pgserver import PgServer  # noqa: E402

SETTINGS = "benchproject.settings_history"
#: The history's span: finished_at runs back this far.
SPAN_DAYS = 30
QUEUES = ["default", "emails", "reports", "billing", "exports"]
TASKS = [f"bench.history.task_{n:02d}" for n in range(20)]
#: The tables' states, each a database: see the module's docstring.
STATES = ["empty", "page", "current", "history"]
#: Rows of one page of the admin's lists and of the list functions.
PER_PAGE = 100
#: Pseudo-random 0..999 from the row number (multiplicative hashing), one per column.
HASH = "(((i::bigint * {k}) %% 1000003) %% 1000)"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000, help="finished jobs of history")
    p.add_argument("--runs", type=int, default=7, help="timed runs per read (median)")
    p.add_argument("--live", type=int, default=2_000, help="live jobs in every state")
    p.add_argument("--backlog", type=int, default=500_000, help="no-op jobs the worker drains")
    p.add_argument("--window", type=float, default=3.0, help="seconds per claim-rate window")
    p.add_argument(
        "--windows", type=int, default=12, help="pairs of windows (without, with) per pause"
    )
    p.add_argument(
        "--pauses",
        type=lambda v: [float(x) for x in v.split(",")],
        default=[0.0, 0.05],
        help="PURGE_PAUSE values of the purge windows (comma-separated)",
    )
    p.add_argument("--concurrency", type=int, default=4, help="the worker's slots")
    p.add_argument("--quick", action="store_true", help="200,000 rows, fewer runs: a smoke test")
    p.add_argument(
        "--not-before",
        default="",
        help="HH:MM (UTC): fill the tables now, start timing only then (a quiet window)",
    )
    p.add_argument(
        "--keep", type=Path, help="build the server in this directory and leave it (no purge)"
    )
    p.add_argument(
        "--reuse", type=Path, help="time the reads (and the purge) on the server --keep built there"
    )
    p.add_argument(
        "--reads",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        default=[],
        help="time only the reads whose name contains one of these (comma-separated)",
    )
    p.add_argument("--no-purge", action="store_true", help="time the reads only")
    p.add_argument("--output-dir", type=Path, default=BENCH_DIR / "results")
    p.add_argument("--tag", default="", help="name suffix of the report files")
    args = p.parse_args()
    if args.quick:
        args.rows, args.runs, args.backlog = 200_000, 5, 60_000
        args.window, args.windows, args.pauses = 2.0, 5, [0.05]
        args.tag = args.tag or "quick"
    if args.keep and args.reuse:
        p.error("--keep builds a server, --reuse times one built before: one of them")
    # A kept server's history must stay whole for the next --reuse.
    args.no_purge = args.no_purge or bool(args.keep)
    if args.reuse and json.loads((args.reuse / "built.json").read_text()).get("purged"):
        p.error(f"the history in {args.reuse} was purged by an earlier --reuse: --keep again")
    return args


class KeptServer(PgServer):
    """A ``PgServer`` whose data directory outlives the run: built by ``--keep``,
    started again by ``--reuse`` (``built`` says which), stopped but never deleted."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp, self.data = directory, directory / "data"
        self.built = (directory / "built.json").exists()

    def __enter__(self) -> KeptServer:
        if not self.built:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp.mkdir(parents=True)
            super().__enter__()
            return self
        options = (
            f"-p {self.port} -k {self.tmp} -c listen_addresses=127.0.0.1 "
            f"-c max_connections={self.max_connections}"
        )
        log_file = str(self.tmp / "server.log")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", log_file,
                  "-w", "-t", "60", "-o", options, "start")  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")


def wait_until(hhmm: str) -> None:
    """Sleep until ``hhmm`` (UTC) today, if it is ahead."""
    if not hhmm:
        return
    now = datetime.datetime.now(datetime.UTC)
    hour, minute = (int(x) for x in hhmm.split(":"))
    ahead = (now.replace(hour=hour, minute=minute, second=0) - now).total_seconds()
    if ahead > 0:
        log(f"waiting {ahead:.0f} s, until {hhmm} UTC, to time")
        time.sleep(ahead)


def log(message: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", flush=True)


# --- filling the tables on the server ---------------------------------------------------------


def model_insert(model, generated: dict[str, str], source: str) -> tuple[str, list]:
    """``INSERT INTO model (…) SELECT … source``: ``generated`` columns as given, the
    others their model default (as a parameter) or left to the database (nullable,
    ``db_default``). Taken from the model, so a field added later does not break it."""
    from django.db import connection

    columns, values, params = [], [], []
    for field in model._meta.concrete_fields:
        if field.column in generated:
            columns.append(field.column)
            values.append(generated[field.column])
        elif field.primary_key or field.null or field.has_db_default():
            continue
        else:
            columns.append(field.column)
            values.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    sql = f"INSERT INTO {model._meta.db_table} ({', '.join(columns)}) SELECT {', '.join(values)} "
    return sql + source, params


def finished_jobs(first: int, last: int, total: int) -> tuple[str, list]:
    """Rows ``first..last`` of ``total`` finished jobs: row i finished i steps ago
    (one step = the span / total) and has id total + 1 - i, so ids grow with time."""
    from django_dispatch.models import Job

    step = SPAN_DAYS * 86400 / total
    finished = f"(now() - make_interval(secs => i * {step}))"
    state, queue, task = HASH.format(k=7919), HASH.format(k=104729), HASH.format(k=15485863)
    queues = "ARRAY[" + ",".join(f"'{q}'" for q in QUEUES) + "]"
    tasks = "ARRAY[" + ",".join(f"'{t}'" for t in TASKS) + "]"
    generated = {
        "id": f"{total} + 1 - i",
        "namespace": "''",
        "backend": "'default'",
        # Most of the history succeeded, some failed, a few were cancelled.
        "state": f"CASE WHEN {state} < 940 THEN 'succeeded' "
        f"WHEN {state} < 970 THEN 'failed' ELSE 'cancelled' END",
        # Queues and tasks skewed as on a site: a few take most of the jobs.
        "queue_name": f"({queues})[1 + floor(5 * power({queue} / 1000.0, 2))::int]",
        "task_path": f"({tasks})[1 + floor(20 * power({task} / 1000.0, 3))::int]",
        "enqueued_at": f"{finished} - interval '3 seconds'",
        "run_after": f"{finished} - interval '3 seconds'",
        "started_at": f"{finished} - interval '1 second'",
        "last_attempted_at": f"{finished} - interval '1 second'",
        "finished_at": finished,
        "attempts": f"CASE WHEN {state} BETWEEN 940 AND 969 THEN 3 ELSE 1 END",
        "max_attempts": "3",
    }
    return model_insert(Job, generated, f"FROM generate_series({first}, {last}) AS i")


def dead_letters_of(first_id: int, last_id: int) -> tuple[str, list]:
    """One dead letter per failed job with an id in the range; one in ten replayed."""
    from django_dispatch.models import DeadLetter, Job

    generated = {
        "job_id": "j.id",
        "namespace": "j.namespace",
        "task_path": "j.task_path",
        "queue_name": "j.queue_name",
        "error_class": "'builtins.ValueError'",
        "error_message": "'boom'",
        "enqueued_at": "j.enqueued_at",
        "failed_at": "j.finished_at",
        "replayed_at": "CASE WHEN j.id %% 10 = 0 THEN j.finished_at END",
    }
    source = (
        f"FROM {Job._meta.db_table} j WHERE j.state = 'failed' "
        f"AND j.id BETWEEN {first_id} AND {last_id} ORDER BY j.id"
    )
    return model_insert(DeadLetter, generated, source)


def finished_runs(first: int, last: int, total: int) -> tuple[str, list]:
    """Rows ``first..last`` of ``total`` finished workflow runs, ids growing with time."""
    from django_dispatch.models import WorkflowRun

    step = SPAN_DAYS * 86400 / total
    finished = f"(now() - make_interval(secs => i * {step}))"
    kind = HASH.format(k=7919)
    generated = {
        "id": f"{total} + 1 - i",
        "namespace": "''",
        "name": f"(ARRAY['signup','checkout','report'])[1 + {kind} %% 3]",
        "state": f"CASE WHEN {kind} < 980 THEN 'succeeded' "
        f"WHEN {kind} < 995 THEN 'cancelled' ELSE 'stuck' END",
        "created_at": f"{finished} - interval '10 seconds'",
        "updated_at": finished,
        "finished_at": f"CASE WHEN {kind} < 995 THEN {finished} END",
    }
    return model_insert(WorkflowRun, generated, f"FROM generate_series({first}, {last}) AS i")


def execute(sql: str, params: list | None = None) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


def without_indexes(table: str, fill: Callable[[], None]) -> None:
    """Run ``fill`` with ``table``'s secondary indexes dropped, then build them again:
    a bulk load is several times faster than keeping a dozen indexes up to date."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indexname, i.indexdef FROM pg_indexes i JOIN pg_index x "
            "ON x.indexrelid = (quote_ident(i.schemaname) || '.' || quote_ident(i.indexname))"
            "::regclass WHERE i.tablename = %s AND NOT x.indisprimary "
            "AND NOT x.indisunique",
            [table],
        )
        indexes = cursor.fetchall()
        for name, _ in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
    fill()
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '1GB'")
        for _, definition in indexes:
            cursor.execute(definition)


def fill_page(count: int) -> None:
    """``count`` failed jobs of one queue and task, finished in the last hour, one
    dead letter each, and ``count`` stuck workflow runs: a full page for every
    list read the check times, filtered or not."""
    from django_dispatch.models import Job, WorkflowRun

    finished = "(now() - make_interval(secs => i * 10))"
    sql, params = model_insert(
        Job,
        {
            "id": "i",
            "namespace": "''",
            "backend": "'default'",
            "state": "'failed'",
            "queue_name": f"'{QUEUES[1]}'",
            "task_path": f"'{TASKS[5]}'",
            "enqueued_at": f"{finished} - interval '3 seconds'",
            "run_after": f"{finished} - interval '3 seconds'",
            "started_at": f"{finished} - interval '1 second'",
            "last_attempted_at": f"{finished} - interval '1 second'",
            "finished_at": finished,
            "attempts": "3",
            "max_attempts": "3",
        },
        f"FROM generate_series(1, {count}) AS i",
    )
    execute(sql, params)
    sql, params = dead_letters_of(1, count)
    execute(sql, params)
    sql, params = model_insert(
        WorkflowRun,
        {
            "id": "i",
            "namespace": "''",
            "name": "'signup'",
            "state": "'stuck'",
            "created_at": f"{finished} - interval '10 seconds'",
            "updated_at": finished,
        },
        f"FROM generate_series(1, {count}) AS i",
    )
    execute(sql, params)


def fill_current(rows: int, live: int) -> int:
    """The live backlog and the last hour's finished jobs; returns the recent rows' count."""
    from django_dispatch.models import Job, WorkflowRun

    # At least a few pages of each kind, so that the current table's pages are full.
    recent = min(rows, max(5_000, round(rows * 3600 / (SPAN_DAYS * 86400))))
    sql, params = finished_jobs(1, recent, rows)
    execute(sql, params)
    execute(f"SELECT setval(pg_get_serial_sequence('{Job._meta.db_table}', 'id'), {rows})")
    sql, params = dead_letters_of(rows - recent + 1, rows)
    execute(sql, params)
    runs = rows // 10
    sql, params = finished_runs(1, recent // 10, runs)
    execute(sql, params)
    execute(f"SELECT setval(pg_get_serial_sequence('{WorkflowRun._meta.db_table}', 'id'), {runs})")
    make_live(live)
    return recent


def make_live(count: int) -> None:
    """``count`` live jobs: due, deferred by an hour, and running on a worker."""
    from django.db import connection

    from django_dispatch.models import Job, Worker

    Worker.objects.create(id="bench-history", hostname="bench", pid=1, concurrency=8)
    now = datetime.datetime.now(datetime.UTC)
    made = []
    for n in range(count):
        job = Job(task_path=TASKS[n % 3], queue_name=QUEUES[n % 2], args=[], kwargs={})
        if n % 4 == 1:
            job.run_after = now + datetime.timedelta(hours=1)
        if n % 4 == 3:
            job.state, job.worker_id, job.started_at = "running", "bench-history", now
            job.lease_expires_at = now + datetime.timedelta(hours=1)
        made.append(job)
    Job.objects.bulk_create(made, batch_size=1000)
    connection.close()


def fill_history(rows: int, recent: int) -> None:
    """The history below the recent rows, its dead letters and workflow runs.

    Dead letters are inserted in id order, as failures happen, though the recent
    jobs' ones came first: dead letters are listed by their own id."""
    from django_dispatch.models import DeadLetter, Job, WorkflowRun

    chunk = 1_000_000

    def jobs() -> None:
        for first in range(recent + 1, rows + 1, chunk):
            sql, params = finished_jobs(first, min(rows, first + chunk - 1), rows)
            execute(sql, params)
            log(f"  jobs: {min(rows, first + chunk - 1):,} of {rows:,}")

    without_indexes(Job._meta.db_table, jobs)
    # Dead letters in id order (as failures happen), then the recent jobs' ones.
    sql, params = dead_letters_of(1, rows - recent)
    without_indexes(DeadLetter._meta.db_table, lambda: execute(sql, params))
    runs = rows // 10
    sql, params = finished_runs(recent // 10 + 1, runs, runs)
    without_indexes(WorkflowRun._meta.db_table, lambda: execute(sql, params))


def vacuum_analyze() -> None:
    """What autovacuum does to a site's history before anyone times it: the
    statistics, and the visibility map that lets a count walk an index alone
    (``Heap Fetches: 0``). A history only ever grows and then stays put, and
    autovacuum's insert threshold (PostgreSQL 13+) vacuums such a table; the
    counts walk their index oldest first, into that settled part. Never
    vacuumed, each count would visit up to 10,001 rows scattered over the
    table: what a freshly restored database costs, not a running site."""
    from django.db import connection

    from django_dispatch.models import DeadLetter, Job, WorkflowRun

    with connection.cursor() as cursor:
        for model in (Job, DeadLetter, WorkflowRun):
            cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")


# --- the reads --------------------------------------------------------------------------------


def reads() -> dict[str, Callable[[], object]]:
    """Every read the check times, by name."""
    from io import StringIO

    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    from django_dispatch import dead_letters, jobs, workflows
    from django_dispatch.queries import console

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "bench@example.com", "bench"
    )
    client = Client()
    client.force_login(user)

    def page(url: str) -> Callable[[], object]:
        def get() -> object:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)
            return response

        return get

    emails, task = QUEUES[1], TASKS[5]
    return {
        "admin: job list": page("/admin/django_dispatch/job/"),
        "admin: job list, failed": page("/admin/django_dispatch/job/?state__exact=failed"),
        "admin: job list, a queue": page(f"/admin/django_dispatch/job/?queue_name={emails}"),
        "admin: dead letter list": page("/admin/django_dispatch/deadletter/"),
        "admin: console overview": page("/admin/django_dispatch/job/overview/"),
        "console.overview()": console.overview,
        "jobs.list()": jobs.list,
        "jobs.list(state=failed)": lambda: jobs.list(state="failed"),
        "jobs.list(queue=)": lambda: jobs.list(queue=emails),
        "jobs.list(task=)": lambda: jobs.list(task=task),
        "jobs.count()": jobs.count,
        "jobs.count(state=failed)": lambda: jobs.count(state="failed"),
        "jobs.count(state=pending)": lambda: jobs.count(state="pending"),
        "jobs.count(queue=)": lambda: jobs.count(queue=emails),
        "jobs.count(task=)": lambda: jobs.count(task=task),
        "dead_letters.list()": dead_letters.list,
        "dead_letters.count()": dead_letters.count,
        "dead_letters.count(replayed=False)": lambda: dead_letters.count(replayed=False),
        "workflows.list_runs()": workflows.list_runs,
        "workflows.list_runs(state=stuck)": lambda: workflows.list_runs(state="stuck"),
        "workflows.count_runs()": workflows.count_runs,
        "workflows.count_runs(state=stuck)": lambda: workflows.count_runs(state="stuck"),
        "dispatch_status": lambda: call_command("dispatch_status", stdout=StringIO()),
        "dispatch_status --json": lambda: call_command(
            "dispatch_status", "--json", stdout=StringIO()
        ),
    }


def use_database(name: str) -> None:
    """Point Django's default connection at the server's database ``name`` (a state)."""
    from django.db import connections

    connection = connections["default"]
    connection.close()
    connection.settings_dict["NAME"] = name


def time_reads(runs: int, only: list[str]) -> dict[str, dict[str, dict]]:
    """By state, each read's median and max of ``runs`` warm calls, in milliseconds,
    and what the counts answered (the estimate above ``COUNT_EXACT_MAX``).

    Interleaved: each run of a read is timed at every state in turn, after one
    untimed call there (the connection is opened again at each switch). ``only``:
    the reads whose name contains one of these, or every read."""
    by_state = {}
    for state in STATES:
        use_database(state)
        by_state[state] = reads()  # a user and a session in each database
    took: dict[str, dict[str, list[float]]] = {s: {} for s in STATES}
    answers: dict[str, object] = {}
    for name in by_state[STATES[0]]:
        if only and not any(part in name for part in only):
            continue
        for _ in range(runs):
            for state in STATES:
                use_database(state)
                read = by_state[state][name]
                answers[state, name] = read()  # warm: connection, plans, buffers
                started = time.perf_counter()
                read()
                took[state].setdefault(name, []).append((time.perf_counter() - started) * 1000)
    use_database("history")
    return {
        state: {
            name: {
                "median_ms": statistics.median(times),
                "max_ms": max(times),
                "answer": answers[state, name] if isinstance(answers[state, name], int) else None,
            }
            for name, times in took[state].items()
        }
        for state in STATES
    }


# --- the purge against the claims --------------------------------------------------------------


def pending() -> int:
    from django_dispatch.models import Job

    return Job.objects.filter(state="pending", queue_name="drain").count()


def purge_against_claims(args: argparse.Namespace) -> dict:
    """Claim rate of one worker in short windows alternating without and with a
    purge, at each of ``--pauses`` (the purge's ``PURGE_PAUSE``).

    One ``dispatch_purge`` per pause runs through all of its windows, stopped
    (``SIGSTOP``) in the windows without and let go on (``SIGCONT``) in the
    windows with: no process start in a window, and the windows are short
    and many, so that the machine's drift (other sessions' load) moves the
    two kinds alike. A stopped purge holds nothing: each of its statements
    commits on its own, and one under way when stopped runs to its end."""
    from bench import tasks
    from django.db import connection

    from django_dispatch import enqueue_many

    for start in range(0, args.backlog, 10_000):
        count = min(10_000, args.backlog - start)
        enqueue_many(tasks.noop.using(queue_name="drain"), [((), {})] * count)
    connection.close()
    manage = django_setup.manage_py()
    worker = subprocess.Popen(
        [
            sys.executable,
            manage,
            "rundispatch",
            "--queues",
            "drain",
            "--concurrency",
            str(args.concurrency),
        ],
        env={**os.environ, "BENCH_NO_PURGE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runs = {}
    try:
        time.sleep(5)  # started, leader elected, first sweeps done
        for pause in args.pauses:
            runs[str(pause)] = windows_at(manage, pause, args)
    finally:
        worker.terminate()
        worker.wait(60)
    return {"pauses": runs, "backlog_left": pending()}


def windows_at(manage: str, pause: float, args: argparse.Namespace) -> dict:
    """``--windows`` pairs of windows (without, with the purge), and one more
    without at the end: each window with the purge is compared with the mean
    of the two around it."""
    deleted_before = jobs_deleted()
    purge = subprocess.Popen(
        [sys.executable, manage, "dispatch_purge", "--max-seconds", "100000"],
        env={**os.environ, "BENCH_PURGE_PAUSE": str(pause)},
        stdout=subprocess.DEVNULL,
    )
    time.sleep(2.0)  # its start-up, then deleting: out of the windows
    purging = 2.0
    without: list[float] = []
    with_purge: list[float] = []
    try:
        for _ in range(args.windows):
            purge.send_signal(signal.SIGSTOP)
            without.append(claim_rate(args.window))
            purge.send_signal(signal.SIGCONT)
            started = time.monotonic()
            with_purge.append(claim_rate(args.window))
            purging += time.monotonic() - started
        purge.send_signal(signal.SIGSTOP)
        without.append(claim_rate(args.window))
    finally:
        purge.terminate()
        purge.send_signal(signal.SIGCONT)
        purge.wait(60)
    around = zip(with_purge, without[:-1], without[1:], strict=True)
    ratios = [w / ((a + b) / 2) for w, a, b in around if a + b]
    log(
        f"  pause {pause:g} s: without {statistics.median(without):.0f}/s, "
        f"with {statistics.median(with_purge):.0f}/s, ratio {statistics.median(ratios):.2f}"
    )
    return {
        "without": without,
        "with": with_purge,
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        "without_per_s": statistics.median(without),
        "with_per_s": statistics.median(with_purge),
        # Its start-up counted as purging: a little under the real rate.
        "deleted_per_s": (jobs_deleted() - deleted_before) / purging,
    }


def jobs_deleted() -> int:
    """Rows deleted from the job table so far (the statistics a backend reports
    as it goes idle and when it exits)."""
    from django.db import connection

    from django_dispatch.models import Job

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_del FROM pg_stat_user_tables WHERE relname = %s",
            [Job._meta.db_table],
        )
        return int(cursor.fetchone()[0])


def claim_rate(seconds: float) -> float:
    """Jobs of the drain queue claimed (and run) per second over ``seconds``."""
    before, started = pending(), time.monotonic()
    time.sleep(seconds)
    return (before - pending()) / (time.monotonic() - started)


# --- the report --------------------------------------------------------------------------------


def render(args, info: dict, timings: dict[str, dict], purge: dict) -> str:
    history = timings["history"]
    lines = [
        f"# History at scale: {args.rows:,} finished jobs",
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        "",
        "Warm reads, median of "
        f"{args.runs}, interleaved across the states (ms). *empty*: the tables just "
        "migrated; *page*: one page of rows and no history "
        f"({PER_PAGE} failed jobs of one queue and task, their dead letters, "
        f"{PER_PAGE} stuck workflow runs: every list read shows a full page); *current*: "
        f"{info['current_rows']} (the live work, no history); *history*: the same plus "
        f"{args.rows:,} finished jobs, their dead letters and {args.rows // 10:,} workflow "
        "runs. Target: history / empty <= 2.",
        "",
        "| read | empty | page | current | history | history / empty | history / page "
        "| answer at history |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in history:
        ms = {state: timings[state][name]["median_ms"] for state in timings}
        answer = history[name]["answer"]
        cells = [f"{ms[state]:.1f}" for state in ("empty", "page", "current", "history")]
        for base in ("empty", "page"):
            ratio = ms["history"] / ms[base]
            cells.append(f"{ratio:.2f}{'' if ratio <= 2 else ' **over**'}")
        answer_cell = "" if answer is None else f"{answer:,}"
        lines.append(f"| {name} | {' | '.join(cells)} | {answer_cell} |")
    if not purge["pauses"]:
        return "\n".join([*lines, "", "(The purge was not run.)"]) + "\n"
    lines += [
        "",
        f"Claims during a purge: one worker x {args.concurrency} slots draining no-op jobs, "
        f"in {args.window:g} s windows alternating without and with `dispatch_purge` "
        f"({args.windows} with, {args.windows + 1} without, per `PURGE_PAUSE`): one purge "
        "process per row, stopped (SIGSTOP) in the windows without and let go on (SIGCONT) "
        "in the windows with. Each window with the purge is divided by the mean of the two "
        "windows without around it; the ratio is the median of those. The purge rests "
        "`max(PURGE_PAUSE, PURGE_YIELD x its last batch's time)` between batches.",
        "",
        "| PURGE_PAUSE (s) | claims/s without (median) | with (median) | with / around "
        "(each) | median (target >= 0.80) | jobs deleted/s while let go |",
        "|---:|---:|---:|---|---:|---:|",
    ]
    for pause, row in purge["pauses"].items():
        each = ", ".join(f"{r:.2f}" for r in row["ratios"])
        lines.append(
            f"| {pause} | {row['without_per_s']:.0f} | {row['with_per_s']:.0f} | {each} | "
            f"{row['ratio']:.2f}{'' if row['ratio'] >= 0.8 else ' **under**'} | "
            f"{row['deleted_per_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    started = time.monotonic()
    kept = args.keep or args.reuse
    with KeptServer(kept) if kept else PgServer() as pg:
        reused = isinstance(pg, KeptServer) and pg.built
        url = pg.url("history") if reused else pg.create_database("history")
        django_setup.setup(url, SETTINGS)
        info = describe(pg)
        if reused:
            built = json.loads((pg.tmp / "built.json").read_text())
            args.rows, info["current_rows"] = built["rows"], built["current_rows"]
            info["tables"] = (
                f"built by --keep in {pg.tmp} at {built['date']} ({built['commit']}), "
                f"timed again here; migrated: {', '.join(migrate_kept()) or 'nothing to do'}"
            )
        else:
            info.update(build(pg, args))
            log(f"history: filled in {time.monotonic() - started:.0f} s; timing")
            if isinstance(pg, KeptServer):
                (pg.tmp / "built.json").write_text(json.dumps({**info, "rows": args.rows}))
        wait_until(args.not_before)
        info["load average when timing began"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        timings = time_reads(args.runs, args.reads)
        purge: dict = {"pauses": {}}
        if not args.no_purge:
            log("history: timed; the purge against the claims")
            if isinstance(pg, KeptServer):
                built = json.loads((pg.tmp / "built.json").read_text())
                (pg.tmp / "built.json").write_text(json.dumps({**built, "purged": True}))
            purge = purge_against_claims(args)
        info["took"] = f"{time.monotonic() - started:.0f} s"
        info["load average at the end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        report = render(args, info, timings, purge)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    name = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d}-history"
    name += f"-{args.tag}" if args.tag else ""
    (args.output_dir / f"{name}.json").write_text(
        json.dumps({"info": info, "timings": timings, "purge": purge}, indent=2, default=str)
    )
    (args.output_dir / f"{name}.md").write_text(report)
    print(report)


def describe(pg: PgServer) -> dict[str, str]:
    """What a reader of the report needs to know of the run's code, machine and server."""
    from django.conf import settings

    import django_dispatch
    from django_dispatch import __version__

    return {
        "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        # A ``git archive`` snapshot has no repository: its runner names the commit.
        "commit": os.environ.get("BENCH_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "django_dispatch": f"{__version__}, {Path(django_dispatch.__file__).parent}",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "postgresql": json.dumps(pg.settings()),
        "DISPATCH": json.dumps(settings.DISPATCH),
        "load average at the start (1, 5, 15 min)": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def migrate_kept() -> list[str]:
    """Apply this checkout's migrations to every state's database of a kept server,
    so that a schema change (an index dropped or added) is timed on the history
    built before it, without building it again; returns what was applied."""
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    applied: list[str] = []
    for state in STATES:
        use_database(state)
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        applied = [f"{m.app_label}.{m.name}" for m, _ in plan] or applied
        call_command("migrate", verbosity=0)
    use_database("history")
    return applied


def build(pg: PgServer, args: argparse.Namespace) -> dict[str, str]:
    """The four states' databases, filled (see the module's docstring)."""
    from django.core.management import call_command

    # Each state is a database of its own on the server, so that the reads
    # are timed interleaved (each run of a read at every state in turn): a
    # machine whose load changes between states moves them all alike.
    for state in STATES[:-1]:
        pg.create_database(state)
        use_database(state)
        call_command("migrate", verbosity=0)
    use_database("page")
    fill_page(PER_PAGE)
    vacuum_analyze()
    use_database("current")
    recent = fill_current(args.rows, args.live)
    vacuum_analyze()
    use_database("history")
    fill_current(args.rows, args.live)
    log("empty, page, current: made; filling the history")
    fill_history(args.rows, recent)
    vacuum_analyze()
    return {"current_rows": f"{args.live:,} live jobs and {recent:,} finished in the last hour"}


if __name__ == "__main__":
    main()
