"""Flow-control task options (issue #17), validated without the database.

``@task(concurrency_limit=N)`` with ``.using(concurrency_key=...)``: at most
N jobs of the task run at once per key, across the cluster (enforced by the
claim, see ``store.flow``). Rows carry their limit and key so that the claim
needs no task import; a task without a limit adds no column value at all
(``concurrency_columns`` is empty), so plain enqueues are unchanged.
"""

from __future__ import annotations

from typing import Any

from .compat import InvalidTask, Task


def check_concurrency(task: Task) -> None:
    """InvalidTask, saying what to change, for concurrency options that cannot work.

    A ``concurrency_key`` needs a ``concurrency_limit`` (a key alone would
    limit nothing); a partition key already means one at a time in order, so
    both on one job would be two gates with different promotion rules; jobs
    with resource needs are claimed by their own path (#16), which does not
    apply limits, so the combination is refused rather than silently unlimited.
    """
    limit = getattr(task, "concurrency_limit", None)
    key = getattr(task, "concurrency_key", None)
    if limit is None:
        if key is not None:
            raise InvalidTask(
                f"concurrency_key={key!r} needs @task(concurrency_limit=N) on "
                f"{task.module_path}: a key alone limits nothing."
            )
        return
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidTask(f"concurrency_limit must be a whole number of at least 1, got {limit!r}.")
    if getattr(task, "partition_key", None) is not None:
        raise InvalidTask(
            "a job cannot have both a partition_key (one at a time, in order) and a "
            "concurrency_limit; use concurrency_limit=1 with a concurrency_key for "
            "one at a time in any order."
        )
    if getattr(task, "resources", None):
        raise InvalidTask("concurrency_limit cannot be combined with resources yet.")


def concurrency_columns(task: Task) -> dict[str, Any]:
    """The job columns of a task's concurrency limit; empty without one."""
    limit = getattr(task, "concurrency_limit", None)
    if limit is None:
        return {}
    return {
        "concurrency_key": getattr(task, "concurrency_key", None) or "",
        "concurrency_limit": limit,
    }
