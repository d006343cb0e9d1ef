"""Where a task's jobs may run: its needs and locality, worked out at enqueue.

``resources="auto"`` is resolved here, from the task's usage history, each
time an enqueue plan is made (an auto task's plan is not kept, so its needs
follow its history). Jobs carry their resolved needs: a worker compares
numbers, never history.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..compat import Task
from ..core.resources import (
    AUTO,
    AUTO_HISTORY,
    AUTO_MIN_HISTORY,
    Needs,
    check_needs,
    percentile,
    shape_of,
)
from ..store.types import JobSpec
from ..store.usage import usage_newest


def is_auto(task: Task) -> bool:
    return getattr(task, "resources", None) == AUTO


def place(spec: JobSpec, task: Task) -> JobSpec:
    """``spec`` with the task's resolved needs, their shape and its locality."""
    resources = getattr(task, "resources", None)
    locality = getattr(task, "locality", None)
    if resources is None and locality is None:
        return spec
    if resources == AUTO:
        needs = auto_needs(spec.task_path, spec.namespace)
    else:
        needs = check_needs(resources)
    return replace(spec, resources=needs, resource_shape=shape_of(needs), locality=locality)


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
