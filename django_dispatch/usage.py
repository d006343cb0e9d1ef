"""What jobs cost, per attempt (#16): ``records`` and ``summary``.

Every attempt that ran task code leaves one ``JobUsage`` row (see
``models.usage`` for what each number means), written with its outcome.
These are the reads an operator or an estimator makes: the newest records,
globally or of one task, and per-task percentiles over a window.
``resources="auto"`` is built on ``auto_needs``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from .compat import Task
from .core.resources import AUTO_HISTORY, AUTO_MIN_HISTORY, Needs, percentile
from .models import JobUsage
from .store.usage import usage_newest
from .tasks.enqueue import namespace_for

__all__ = ["auto_needs", "records", "summary"]

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
        task_path=_task_path(task), namespace=namespace_for(backend), since=since, limit=limit
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


def auto_needs(task_path: str, namespace: str, *, db: str | None = None) -> Needs | None:
    """``resources="auto"``: ``{"memory_mb": p95 of peak RSS}`` over the task's newest
    ``AUTO_HISTORY`` measured attempts, rounded up; None (no needs) before
    ``AUTO_MIN_HISTORY`` of them exist."""
    rows = usage_newest(task_path=task_path, namespace=namespace, limit=AUTO_HISTORY, db=db)
    rss = [r.peak_rss_mb for r in rows if r.peak_rss_mb is not None]
    if len(rss) < AUTO_MIN_HISTORY:
        return None
    p95 = percentile(rss, 0.95)
    return {"memory_mb": math.ceil(p95)} if p95 else None
