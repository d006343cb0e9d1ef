"""What jobs cost, read back: the newest usage records and per-task percentiles.

Every attempt that ran task code leaves one ``JobUsage`` row (see
``models.usage`` for what each number means), written with its outcome by
the completer. These are the reads an operator or an estimator makes: the
newest records, globally or of one task, and per-task percentiles over a
window. (``resources="auto"`` reads the same rows at enqueue, in
``tasks.placement``.)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..compat import Task
from ..core.resources import percentile
from ..models import JobUsage
from ..store import database_for
from ..store.usage import usage_newest
from ..tasks.registry import namespace_for

#: Most records ``summary`` reads (the newest ones within its window).
SUMMARY_MAX_RECORDS = 10_000


def _task_path(task: Task | str | None) -> str | None:
    if task is None or isinstance(task, str):
        return task
    return task.module_path


def records(
    task: Task | str | None = None,
    *,
    since: datetime | None = None,
    limit: int = 100,
    backend: str = "default",
) -> list[JobUsage]:
    """The newest ``limit`` usage records, newest first: of ``task`` (a Task or
    its import path) or of every task, finished at or after ``since``.

    ``backend``: the TASKS alias whose namespace to read (default ``"default"``).
    """
    return usage_newest(
        task_path=_task_path(task),
        namespace=namespace_for(backend),
        since=since,
        limit=limit,
        db=database_for(backend),  # the alias's database, as its namespace
    )


def summary(
    task: Task | str, *, since: datetime | None = None, backend: str = "default"
) -> dict[str, Any]:
    """Percentiles of ``task``'s attempts finished since ``since`` (the newest
    ``SUMMARY_MAX_RECORDS`` at most): ``count``, ``wall_p50``, ``wall_p95``,
    ``cpu_p50``, ``cpu_p95`` (seconds) and ``peak_rss_mb_p95``, each None
    when no record has that number (a lost worker's attempt has none)."""
    rows = usage_newest(
        task_path=_task_path(task),
        namespace=namespace_for(backend),
        since=since,
        limit=SUMMARY_MAX_RECORDS,
        db=database_for(backend),
    )

    def values(name: str) -> list[float]:
        return [v for v in (getattr(r, name) for r in rows) if v is not None]

    wall, cpu, rss = values("wall_seconds"), values("cpu_seconds"), values("peak_rss_mb")
    return {
        "count": len(rows),
        "wall_p50": percentile(wall, 0.5),
        "wall_p95": percentile(wall, 0.95),
        "cpu_p50": percentile(cpu, 0.5),
        "cpu_p95": percentile(cpu, 0.95),
        "peak_rss_mb_p95": percentile(rss, 0.95),
    }
