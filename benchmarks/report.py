"""Medians of the runs, django_dispatch's ratios and targets, as Markdown."""

from __future__ import annotations

import statistics
from typing import Any

DISPATCH = "dispatch"
PEERS = ["django-tasks-db", "procrastinate", "pgqueuer", "chancy"]
RAW_1, RAW_100 = "raw (1 job/txn)", "raw (100 jobs/txn)"

#: (key, column title, format, higher is better)
COLUMNS = [
    ("enqueue_per_s", "enqueue/s (1 per txn)", "{:,.0f}", True),
    ("bulk_per_s", "bulk enqueue/s", "{:,.0f}", True),
    ("drain_per_s", "drain/s", "{:,.0f}", True),
    ("steady_drain_per_s", "steady drain/s", "{:,.0f}", True),
    ("realistic_drain_per_s", "realistic drain/s", "{:,.0f}", True),
    ("realistic_steady_drain_per_s", "realistic steady/s", "{:,.0f}", True),
    ("latency_p50_ms", "latency p50 ms", "{:.1f}", False),
    ("latency_p95_ms", "p95 ms", "{:.1f}", False),
    ("latency_p99_ms", "p99 ms", "{:.1f}", False),
    ("worker_cpu_ms_per_job", "worker CPU ms/job", "{:.2f}", False),
    ("pg_cpu_ms_per_job", "PostgreSQL CPU ms/job", "{:.2f}", False),
    ("idle_cpu_pct", "idle CPU %", "{:.2f}", False),
    ("other_cpu_pct", "other load % (during drain)", "{:.0f}", False),
    ("peak_rss_mb", "worker peak RSS MB", "{:.0f}", False),
]

#: Shown beside the measurements, never compared: what a row measured.
INFO_COLUMNS = [("realistic_jobs", "realistic jobs", "{:,.0f}")]

#: What each row's configuration is (the drivers' ``CONFIGS``, for the report).
CONFIG_NOTES = {
    "dispatch": "rundispatch --processes W --concurrency C (LISTEN on)",
    "dispatch [prepared]": "the same with DATABASES OPTIONS['prepare_threshold'] = 5: psycopg "
    "prepares the claim and a wave's finish, bound on the server (direct connections; not "
    "behind PgBouncer in transaction mode); not counted in the targets",
    "pgqueuer [asyncpg+uvloop]": "batch_size=C/2, max_concurrent_tasks=C; workers on asyncpg "
    "and uvloop, as `pgq run` runs them (bulk enqueues on asyncpg too)",
    "pgqueuer [defaults, asyncpg+uvloop]": "QueueManager.run() defaults: batch_size=10, no cap "
    "on tasks; asyncpg, uvloop",
    "pgqueuer [psycopg]": "batch_size=C/2, max_concurrent_tasks=C; workers on a psycopg "
    "AsyncConnection, plain asyncio",
    "pgqueuer [defaults, psycopg]": "QueueManager.run() defaults; psycopg, plain asyncio",
    "pgqueuer [asyncpg+uvloop, ORM job]": "the realistic job only, as a Django site on PgQueuer "
    "writes it: the same two ORM statements as the Django systems' task "
    "(bench.orders.place_order) through asgiref's sync_to_async(thread_sensitive=False) on C "
    "threads, each with its own connection, in workers that set Django up (CONN_MAX_AGE=600); "
    "otherwise the [asyncpg+uvloop] row's configuration",
    "pgqueuer [defaults, asyncpg+uvloop, ORM job]": "the realistic job only, the same ORM body "
    "through sync_to_async(place_order) as Django documents it (thread_sensitive=True: one "
    "thread and one connection per process); otherwise the [defaults, asyncpg+uvloop] row's "
    "configuration",
    "procrastinate": "sync tasks in threads, concurrency=C",
    "procrastinate [async]": "async tasks on the event loop, concurrency=C",
    "procrastinate [defaults]": "sync tasks, concurrency=1 (its default)",
    "django-tasks-db": "W x C db_worker processes (one task each), --no-startup-delay",
    "django-tasks-db [defaults]": "W db_worker processes, --no-startup-delay",
    "chancy": "Worker() with its default plugins; Queue(concurrency=C, executor=Threaded, "
    "eager_polling=True). Chancy writes finished jobs once a second, so its steady drain/s "
    "(from the first write) overstates drains of a few seconds: compare drain/s",
    "chancy [async]": "the same jobs as async def; Queue(concurrency=C, executor=Async, "
    "eager_polling=True)",
    "chancy [defaults]": "Queue defaults (process pool, a process per CPU, recycled every 100 "
    "jobs) but eager_polling=True: without it a backlog drains at W x CPUs jobs per 5 s poll",
}


def row_name(system: str, config: str) -> str:
    """The table row of ``system`` at ``config``; the slot-matched one keeps the bare name."""
    return system if config == "matched" else f"{system} [{config}]"


def base_system(row: str) -> str:
    return row.split(" [", 1)[0]


def configurations_note() -> str:
    return "; ".join(f"**{row}**: {note}" for row, note in CONFIG_NOTES.items()) + (
        ". A peer counts in the targets at whichever of its rows is better."
    )


#: The row suffix, and the result prefix, of a realistic job written with Django's ORM
#: by a system that has its own body too (``Driver.realistic_variants``).
ORM_JOB, ORM_PREFIX = "ORM job", "orm_"


def orm_row(row: str) -> str:
    """``pgqueuer [asyncpg+uvloop]`` -> ``pgqueuer [asyncpg+uvloop, ORM job]``."""
    return f"{row[:-1]}, {ORM_JOB}]" if row.endswith("]") else f"{row} [{ORM_JOB}]"


def flatten(system: str, result: dict) -> dict[str, dict]:
    """One table row per system; the raw baseline gives two, and a system that also
    drained the realistic job written with the ORM gives an ORM job row."""
    if system != "raw":
        orm = {k: v for k, v in result.items() if k.startswith(ORM_PREFIX + "realistic")}
        own = {k: v for k, v in result.items() if k not in orm}
        if not orm:
            return {system: own}
        return {system: own, orm_row(system): {k[len(ORM_PREFIX) :]: v for k, v in orm.items()}}
    return {
        RAW_1: {
            **result["batch1"],
            "enqueue_per_s": result["enqueue_per_s"],
            "bulk_per_s": result["bulk_per_s"],
        },
        RAW_100: result["batch100"],
    }


def medians(runs: list[dict]) -> dict[str, Any]:
    """The median of each numeric metric over the runs that measured it."""
    keys = {k for run in runs for k, v in run.items() if isinstance(v, int | float)}
    out: dict[str, Any] = {}
    for key in sorted(keys):
        values = [run[key] for run in runs if isinstance(run.get(key), int | float)]
        out[key] = statistics.median(values) if values else None
    return out


def fmt(value: Any, spec: str = "{:,.0f}") -> str:
    return "—" if value is None else spec.format(value)


def results_table(rows: dict[str, dict]) -> str:
    lines = [
        "| system | " + " | ".join(c[1] for c in [*COLUMNS, *INFO_COLUMNS]) + " |",
        "|---|" + "---:|" * (len(COLUMNS) + len(INFO_COLUMNS)),
    ]
    for system, values in rows.items():
        cells = [fmt(values.get(key), spec) for key, _, spec, _ in COLUMNS]
        cells += [fmt(values.get(key), spec) for key, _, spec in INFO_COLUMNS]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios_table(rows: dict[str, dict]) -> str:
    """django_dispatch's value divided by each other system's, per metric."""
    mine = rows.get(DISPATCH)
    others = [s for s in rows if s != DISPATCH]
    if not mine or not others:
        return "(needs django_dispatch and at least one other system)"
    lines = ["| metric | " + " | ".join(others) + " |", "|---|" + "---:|" * len(others)]
    for key, title, _, higher in COLUMNS:
        cells = [fmt(ratio(mine.get(key), rows[s].get(key)), "{:.2f}x") for s in others]
        better = "higher" if higher else "lower"
        lines.append(f"| {title} ({better} is better) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fastest_peer(rows: dict[str, dict], key: str, among=None) -> tuple[float | None, str]:
    """The best value of ``key`` over the peers' rows (those ``among`` accepts)."""
    found = [
        (values[key], row)
        for row, values in rows.items()
        if base_system(row) in PEERS
        and (among is None or among(row))
        and values.get(key) is not None
    ]
    return max(found) if found else (None, "")


def runs_orm_body(row: str) -> bool:
    """Whether a peer's realistic job is the Django systems' ORM body: django-tasks-db
    runs their very task; PgQueuer's ORM job rows call it through sync_to_async."""
    return base_system(row) == "django-tasks-db" or row.endswith(f", {ORM_JOB}]")


def is_pgqueuer(row: str) -> bool:
    return base_system(row) == "pgqueuer"


#: The async check's rows (``run.Bench.async_sleep_rows``) that the targets compare.
ASYNC_OURS, ASYNC_THREADS = "dispatch [asyncio]", "dispatch [threads]"


def _async_best(check: dict, system: str, key: str) -> tuple[float | None, str]:
    """The better of ``system``'s rows in the async check, by ``key``."""
    found = [
        (values[key], row)
        for row, values in check.get("rows", {}).items()
        if base_system(row) == system and values.get(key) is not None
    ]
    return max(found) if found else (None, "")


def _async_ratios(check: dict, key: str) -> dict[str, tuple[float | None, str]]:
    """Our asyncio row over each peer's better row (PgQueuer, procrastinate, Chancy) and
    over our thread executor."""
    rows = check.get("rows", {})
    ours = rows.get(ASYNC_OURS, {}).get(key)
    out = {}
    for label, system in (
        ("pgqueuer", "pgqueuer"),
        ("procrastinate", "procrastinate"),
        ("chancy", "chancy"),
    ):
        best, row = _async_best(check, system, key)
        out[label] = (ratio(ours, best), row)
    out["threads"] = (ratio(ours, rows.get(ASYNC_THREADS, {}).get(key)), ASYNC_THREADS)
    return out


#: The async check's target: our asyncio row over PgQueuer's better row.
ASYNC_PGQ_TARGET = 1.0


def targets(rows: dict[str, dict], extras: dict[str, dict]) -> list[tuple[str, str, bool | None]]:
    """The targets: (target, measured value as text, met or None if not measured).

    First the speed issue's "done when" (each peer at its better row), then the
    earlier issues' targets, still reported; last a reference line without a target.
    """
    me = rows.get(DISPATCH, {})
    flat, part, rss, scale = (extras.get(k, {}) for k in ("flatness", "partitions", "rss", "scale"))
    fan, anoop, areal = (extras.get(k, {}) for k in ("map", "atomic_noop", "atomic_realistic"))
    steady, real = "steady_drain_per_s", "realistic_drain_per_s"
    asleep = extras.get("async_sleep", {})
    async_pgq, async_pgq_row = _async_ratios(asleep, "drain_per_s")["pgqueuer"]
    pgq, pgq_name = _fastest_peer(rows, "drain_per_s", is_pgqueuer)
    pgq_steady, pgq_steady_name = _fastest_peer(rows, steady, is_pgqueuer)
    orm, orm_name = _fastest_peer(rows, real, runs_orm_body)
    orm_steady, orm_steady_name = _fastest_peer(rows, "realistic_" + steady, runs_orm_body)
    any_real, any_real_name = _fastest_peer(rows, real)
    bulk_peer, bulk_name = _fastest_peer(rows, "bulk_per_s")
    # (target, value, how to show it, the test it must pass; None: no target)
    specs = [
        ("no-op drain >= 1.0x PgQueuer at its best (beyond: 2x)", ratio(me.get("drain_per_s"),
         pgq), "{:.2f}x " + pgq_name, lambda v: v >= 1),
        ("(the same, steady state)", ratio(me.get(steady), pgq_steady),
         "{:.2f}x " + pgq_steady_name, lambda v: v >= 1),
        ("worker CPU per job <= 0.07 ms", me.get("worker_cpu_ms_per_job"), "{:.3f} ms",
         lambda v: v <= 0.07),
        ("PostgreSQL CPU per job <= 0.09 ms", me.get("pg_cpu_ms_per_job"), "{:.3f} ms",
         lambda v: v <= 0.09),
        ("async sleep jobs >= 1.0x PgQueuer's better row", async_pgq, "{:.2f}x " + async_pgq_row,
         lambda v: v >= ASYNC_PGQ_TARGET),
        ("(the same, steady state)", _async_ratios(asleep, steady)["pgqueuer"][0], "{:.2f}x",
         lambda v: v >= ASYNC_PGQ_TARGET),
        ("realistic ORM job >= 1.0x the fastest peer running the same ORM job body",
         ratio(me.get(real), orm), "{:.2f}x " + orm_name, lambda v: v >= 1),
        ("(the same, steady state)", ratio(me.get("realistic_" + steady), orm_steady),
         "{:.2f}x " + orm_steady_name, lambda v: v >= 1),
        ("enqueue->start p50 < 5 ms", me.get("latency_p50_ms"), "{:.1f} ms", lambda v: v < 5),
        ("enqueue->start p99 < 50 ms", me.get("latency_p99_ms"), "{:.1f} ms", lambda v: v < 50),
        ("claim flat within 20% with 1M finished jobs", ratio(flat.get("full", {}).get(steady),
         flat.get("empty", {}).get(steady)), "{:.0%} of empty", lambda v: v >= 0.8),
        ("drain atop 1M pending >= 80% of atop 10k", ratio(scale.get("deep", {}).get(steady),
         scale.get("shallow", {}).get(steady)), "{:.0%}", lambda v: v >= 0.8),
        ("partitioned drain >= 50% of unkeyed", ratio(part.get("keyed", {}).get(steady),
         part.get("unkeyed", {}).get(steady)), "{:.0%}", lambda v: v >= 0.5),
        ("ctx.map over 10,000 inputs >= 50% of the drain/s of as many plain jobs "
         "(from start until the run succeeds)", ratio(fan.get("map", {}).get("drain_per_s"),
         fan.get("plain", {}).get("drain_per_s")), "{:.0%}", lambda v: v >= 0.5),
        ("no target: the same, steady state (leaves out the map step creating the children)",
         ratio(fan.get("map", {}).get(steady), fan.get("plain", {}).get(steady)), "{:.0%}",
         None),
        ("realistic job with atomic=True >= 1.0x the same job without", ratio(
         areal.get("atomic", {}).get("drain_per_s"), areal.get("plain", {}).get("drain_per_s")),
         "{:.2f}x", lambda v: v >= 1),
        ("(the same, steady state)", ratio(areal.get("atomic", {}).get(steady),
         areal.get("plain", {}).get(steady)), "{:.2f}x", lambda v: v >= 1),
        ("atomic no-op jobs >= 50% of plain ones", ratio(anoop.get("atomic", {}).get(
         "drain_per_s"), anoop.get("plain", {}).get("drain_per_s")), "{:.0%}",
         lambda v: v >= 0.5),
        ("(the same, steady state)", ratio(anoop.get("atomic", {}).get(steady),
         anoop.get("plain", {}).get(steady)), "{:.0%}", lambda v: v >= 0.5),
        ("RSS after 100k jobs within 10% of after 1k", ratio(rss.get("rss_after_all_mb"),
         rss.get("rss_after_1k_mb")), "{:.2f}x", lambda v: v <= 1.1),
        ("earlier: async sleep jobs >= 10x our thread executor",
         _async_ratios(asleep, "drain_per_s")["threads"][0], "{:.1f}x", lambda v: v >= 10),
        ("earlier: drain >= 25% of raw, 100 jobs/txn", ratio(me.get("drain_per_s"),
         rows.get(RAW_100, {}).get("drain_per_s")), "{:.0%}", lambda v: v >= 0.25),
        ("earlier: bulk enqueue >= the fastest peer's bulk", ratio(me.get("bulk_per_s"),
         bulk_peer), "{:.2f}x " + bulk_name, lambda v: v >= 1),
        ("earlier: enqueue time <= 1.2x a bare ORM create()", ratio(me.get("orm_create_per_s"),
         me.get("paired_enqueue_per_s")), "{:.2f}x", lambda v: v <= 1.2),
        ("earlier: idle worker CPU < 1%", me.get("idle_cpu_pct"), "{:.2f}%", lambda v: v < 1),
        ("no target: realistic job vs the fastest peer with any body (its own SQL too)",
         ratio(me.get(real), any_real), "{:.2f}x " + any_real_name, None),
    ]  # fmt: skip
    return [
        (target, fmt(value, spec) if value is not None else "not measured",
         test(value) if value is not None and test else None)
        for target, value, spec, test in specs
    ]  # fmt: skip


def targets_table(rows: dict[str, dict], extras: dict[str, dict]) -> str:
    lines = ["| target | measured | met? |", "|---|---|---|"]
    for target, text, ok in targets(rows, extras):
        verdict = {True: "yes", False: "**no**", None: "—"}[ok]
        lines.append(f"| {target} | {text} | {verdict} |")
    return "\n".join(lines)


def extras_section(extras: dict[str, dict]) -> str:
    """The optional django_dispatch checks, with their raw numbers."""
    parts = []
    labels = {
        "flatness": ("empty", "full", "finished rows in the table"),
        "partitions": ("unkeyed", "keyed", "partition keys"),
        "concurrency": ("unkeyed", "capped", "keys with concurrency_limit=2"),
        "mixed_sizes": ("plain", "mixed", "resource needs and --capacity"),
        "scale": ("shallow", "deep", "pending backlog"),
        "map": ("plain", "map", "child runs of one ctx.map"),
        "atomic_noop": ("plain", "atomic", "@task(atomic=True)"),
        "atomic_realistic": ("plain", "atomic", "@task(atomic=True)"),
    }
    for name, (a, b, what) in labels.items():
        if name not in extras:
            continue
        e = extras[name]
        parts.append(
            f"- **{name}** ({e['description']}): drain/s {fmt(e[a].get('drain_per_s'))} vs "
            f"{fmt(e[b].get('drain_per_s'))}; steady drain/s "
            f"{fmt(e[a].get('steady_drain_per_s'))} ({a}) vs "
            f"{fmt(e[b].get('steady_drain_per_s'))} ({b}, {what})"
        )
    if "bulk_scale" in extras:
        e = extras["bulk_scale"]
        parts.append(
            f"- **bulk_scale**: one `enqueue_many` of {fmt(e.get('rows'))} rows at "
            f"{fmt(e.get('rows_per_s'))} rows/s; the enqueuing process grew by "
            f"{fmt(e.get('rss_growth_mb'), '{:.0f}')} MB (peak "
            f"{fmt(e.get('peak_rss_mb'), '{:.0f}')} MB)"
        )
    if "rss" in extras:
        e = extras["rss"]
        parts.append(
            f"- **rss** ({e['description']}): {fmt(e.get('rss_after_1k_mb'), '{:.1f}')} MB "
            f"after 1,000 jobs, {fmt(e.get('rss_after_all_mb'), '{:.1f}')} MB after "
            f"{fmt(e.get('rss_jobs'))} jobs (largest worker process)"
        )
    none = "(none run: add --flatness, --partitions, --scale, --rss, --atomic, --map)"
    return "\n".join(parts) if parts else none


#: The async check's columns: (key, title, format).
ASYNC_COLUMNS = [
    ("jobs", "jobs", "{:,.0f}"),
    ("drain_per_s", "drain/s", "{:,.0f}"),
    ("steady_drain_per_s", "steady drain/s", "{:,.0f}"),
    ("worker_cpu_ms_per_job", "worker CPU ms/job", "{:.2f}"),
    ("pg_cpu_ms_per_job", "PostgreSQL CPU ms/job", "{:.2f}"),
    ("server_sessions", "server sessions", "{:.0f}"),
    ("peak_rss_mb", "worker peak RSS MB", "{:.0f}"),
    ("other_cpu_pct", "other load %", "{:.0f}"),
]


def async_sleep_section(check: dict) -> str:
    """The async check (#20): a row per system and configuration, then our ratios."""
    lines = [
        check["description"] + ". Medians; columns as in the results table; server sessions: "
        "the most PostgreSQL client sessions during the drain.",
        "",
        "| row | configuration | " + " | ".join(c[1] for c in ASYNC_COLUMNS) + " |",
        "|---|---|" + "---:|" * len(ASYNC_COLUMNS),
    ]
    unavailable = check.get("unavailable", {})
    for row, values in check.get("rows", {}).items():
        if row in unavailable:
            cells = [fmt(values.get("jobs"))] + [unavailable[row]] + [""] * (len(ASYNC_COLUMNS) - 2)
        else:
            cells = [fmt(values.get(key), spec) for key, _, spec in ASYNC_COLUMNS]
        lines.append(f"| {row} | {values['config']} | " + " | ".join(cells) + " |")
    lines += ["", f"{ASYNC_OURS} ÷ each (drain/s; steady drain/s):", ""]
    drain, steady = (_async_ratios(check, k) for k in ("drain_per_s", "steady_drain_per_s"))
    for label, (value, row) in drain.items():
        goals = {"pgqueuer": f" (target >= {ASYNC_PGQ_TARGET:.1f}x)", "threads": " (target >= 10x)"}
        target = goals.get(label, "")
        better = f", its better row: {row}" if row and label != "threads" else ""
        lines.append(
            f"- {row if label == 'threads' else label}{better}: {fmt(value, '{:.2f}x')}; "
            f"{fmt(steady[label][0], '{:.2f}x')}{target}"
        )
    return "\n".join(lines)
