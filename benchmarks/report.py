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
    "pgqueuer [asyncpg+uvloop]": "batch_size=C/2, max_concurrent_tasks=C; workers on asyncpg "
    "and uvloop, as `pgq run` runs them (bulk enqueues on asyncpg too)",
    "pgqueuer [defaults, asyncpg+uvloop]": "QueueManager.run() defaults: batch_size=10, no cap "
    "on tasks; asyncpg, uvloop",
    "pgqueuer [psycopg]": "batch_size=C/2, max_concurrent_tasks=C; workers on a psycopg "
    "AsyncConnection, plain asyncio",
    "pgqueuer [defaults, psycopg]": "QueueManager.run() defaults; psycopg, plain asyncio",
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


def flatten(system: str, result: dict) -> dict[str, dict]:
    """One table row per system; the raw baseline gives two."""
    if system != "raw":
        return {system: result}
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


def _fastest_peer(rows: dict[str, dict], key: str) -> tuple[float | None, str]:
    found = [
        (values[key], row)
        for row, values in rows.items()
        if base_system(row) in PEERS and values.get(key) is not None
    ]
    return max(found) if found else (None, "")


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


def targets(rows: dict[str, dict], extras: dict[str, dict]) -> list[tuple[str, str, bool | None]]:
    """The issue's targets: (target, measured value as text, met or None if not measured)."""
    me = rows.get(DISPATCH, {})
    flat, part, rss, scale = (extras.get(k, {}) for k in ("flatness", "partitions", "rss", "scale"))
    steady = "steady_drain_per_s"
    asleep = extras.get("async_sleep", {})
    async_pgq, async_pgq_row = _async_ratios(asleep, "drain_per_s")["pgqueuer"]
    drain_peer, drain_name = _fastest_peer(rows, "drain_per_s")
    bulk_peer, bulk_name = _fastest_peer(rows, "bulk_per_s")
    # (target, value, how to show it, the test it must pass)
    specs = [
        ("drain >= 2x the fastest peer", ratio(me.get("drain_per_s"), drain_peer),
         "{:.2f}x " + drain_name, lambda v: v >= 2),
        ("(the same, steady state)", ratio(me.get(steady), _fastest_peer(rows, steady)[0]),
         "{:.2f}x " + _fastest_peer(rows, steady)[1], lambda v: v >= 2),
        ("realistic job drain >= 1.5x the fastest peer",
         ratio(me.get("realistic_drain_per_s"), _fastest_peer(rows, "realistic_drain_per_s")[0]),
         "{:.2f}x " + _fastest_peer(rows, "realistic_drain_per_s")[1], lambda v: v >= 1.5),
        ("async sleep jobs >= 1.5x PgQueuer's better row", async_pgq, "{:.2f}x " + async_pgq_row,
         lambda v: v >= 1.5),
        ("(the same, steady state)", _async_ratios(asleep, steady)["pgqueuer"][0], "{:.2f}x",
         lambda v: v >= 1.5),
        ("async sleep jobs >= 10x our thread executor",
         _async_ratios(asleep, "drain_per_s")["threads"][0], "{:.1f}x", lambda v: v >= 10),
        ("drain >= 25% of raw, 100 jobs/txn", ratio(me.get("drain_per_s"),
         rows.get(RAW_100, {}).get("drain_per_s")), "{:.0%}", lambda v: v >= 0.25),
        ("bulk enqueue >= the fastest peer's bulk", ratio(me.get("bulk_per_s"), bulk_peer),
         "{:.2f}x " + bulk_name, lambda v: v >= 1),
        ("enqueue time <= 1.2x a bare ORM create()", ratio(me.get("orm_create_per_s"),
         me.get("paired_enqueue_per_s")), "{:.2f}x", lambda v: v <= 1.2),
        ("enqueue->start p50 < 5 ms", me.get("latency_p50_ms"), "{:.1f} ms", lambda v: v < 5),
        ("enqueue->start p99 < 50 ms", me.get("latency_p99_ms"), "{:.1f} ms", lambda v: v < 50),
        ("idle worker CPU < 1%", me.get("idle_cpu_pct"), "{:.2f}%", lambda v: v < 1),
        ("claim flat within 20% with 1M finished jobs", ratio(flat.get("full", {}).get(steady),
         flat.get("empty", {}).get(steady)), "{:.0%} of empty", lambda v: v >= 0.8),
        ("partitioned drain >= 50% of unkeyed", ratio(part.get("keyed", {}).get(steady),
         part.get("unkeyed", {}).get(steady)), "{:.0%}", lambda v: v >= 0.5),
        ("drain atop 1M pending >= 80% of atop 10k", ratio(scale.get("deep", {}).get(steady),
         scale.get("shallow", {}).get(steady)), "{:.0%}", lambda v: v >= 0.8),
        ("RSS after 100k jobs within 10% of after 1k", ratio(rss.get("rss_after_all_mb"),
         rss.get("rss_after_1k_mb")), "{:.2f}x", lambda v: v <= 1.1),
    ]  # fmt: skip
    return [
        (target, fmt(value, spec) if value is not None else "not measured",
         test(value) if value is not None else None)
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
    if "fleet" in extras:
        e = extras["fleet"]
        for label in ("direct", "pgbouncer"):
            r = e.get(label, {})
            if "failed" in r:
                parts.append(f"- **fleet, {label}** ({e['description']}): failed: {r['failed']}")
            elif r:
                parts.append(
                    f"- **fleet, {label}** ({e['description']}): drain/s "
                    f"{fmt(r.get('drain_per_s'))}, steady {fmt(r.get('steady_drain_per_s'))}; "
                    f"at most {fmt(r.get('server_sessions'))} server sessions"
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
    return "\n".join(parts) if parts else "(none run: add --flatness, --partitions, --scale, --rss)"


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
        target = {"pgqueuer": " (target >= 1.5x)", "threads": " (target >= 10x)"}.get(label, "")
        better = f", its better row: {row}" if row and label != "threads" else ""
        lines.append(
            f"- {row if label == 'threads' else label}{better}: {fmt(value, '{:.2f}x')}; "
            f"{fmt(steady[label][0], '{:.2f}x')}{target}"
        )
    return "\n".join(lines)
