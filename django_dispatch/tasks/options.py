"""Flow-control task options, validated without the database.

``@task(concurrency_limit=N)`` with ``.using(concurrency_key=...)``: at most
N jobs of the task run at once per key, across the cluster (enforced by the
claim's gates). Rows carry their limit and key so that the claim needs no
task import; a task without a limit adds no column value at all
(``concurrency_columns`` is empty), so plain enqueues pay nothing for it.
"""

from __future__ import annotations

from typing import Any

from ..compat import InvalidTask, Task
from ..conf import queue_limits
from ..core.rates import parse_rate


def check_concurrency(task: Task) -> None:
    """InvalidTask, saying what to change, for concurrency or rate options that cannot work.

    A ``concurrency_key`` needs a limit (a key alone would limit nothing); a
    partition key already means one at a time in order, so both on one job
    would be two gates with different promotion rules; jobs with resource
    needs are claimed by their own path, which does not apply limits,
    so the combination is refused rather than silently unlimited.
    """
    check_unique_for(task)
    check_partition_retry(task)
    limit = getattr(task, "concurrency_limit", None)
    key = getattr(task, "concurrency_key", None)
    rate = getattr(task, "rate_limit", None)
    if rate is not None:
        try:
            parse_rate(rate)
        except ValueError as e:
            raise InvalidTask(str(e)) from e
    check_queue_of(task)
    if limit is None and rate is None:
        if key is not None:
            raise InvalidTask(
                f"concurrency_key={key!r} needs @task(concurrency_limit=N) or "
                f"@task(rate_limit=...) on {task.module_path}: a key alone limits nothing."
            )
        return
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise InvalidTask(f"concurrency_limit must be a whole number of at least 1, got {limit!r}.")
    if getattr(task, "partition_key", None) is not None:
        raise InvalidTask(
            "a job cannot have both a partition_key (one at a time, in order) and a "
            "concurrency_limit or rate_limit; use concurrency_limit=1 with a "
            "concurrency_key for one at a time in any order."
        )
    if getattr(task, "resources", None):
        raise InvalidTask("concurrency or rate limits cannot be combined with resources yet.")


def check_partition_retry(task: Task) -> None:
    retry = getattr(task, "partition_retry", "hold")
    if retry not in ("hold", "yield"):
        raise InvalidTask(f"partition_retry must be 'hold' or 'yield', got {retry!r}.")


def check_unique_for(task: Task) -> None:
    """``unique_for`` is positive seconds and comes with an ``idempotency_key``
    (it widens that key's dedupe to jobs that finished within the window)."""
    window = getattr(task, "unique_for", None)
    if window is None:
        return
    if not isinstance(window, int | float) or isinstance(window, bool) or window <= 0:
        raise InvalidTask(f"unique_for must be a positive number of seconds, got {window!r}.")
    if getattr(task, "idempotency_key", None) is None:
        raise InvalidTask(
            "unique_for needs an idempotency_key: give both, as in "
            ".using(idempotency_key=..., unique_for=3600)."
        )


def concurrency_columns(task: Task) -> dict[str, Any]:
    """The job columns of a task's concurrency and rate limits; empty without any.

    ``concurrency_key`` is set (``""`` for the task-wide group) whenever a
    limit is: a non-NULL key is what sends a row through the claim's gate.
    """
    limit = getattr(task, "concurrency_limit", None)
    rate = getattr(task, "rate_limit", None)
    if limit is None and rate is None:
        if getattr(task, "partition_retry", "hold") == "yield":
            return {"partition_yield": True}
        return {}
    columns: dict[str, Any] = {
        "concurrency_key": getattr(task, "concurrency_key", None) or "",
        "concurrency_limit": limit,
    }
    if rate is not None:
        columns["rate_limit"], columns["rate_period"] = parse_rate(rate)
    return columns


def check_queue_of(task: Task) -> None:
    """InvalidTask for a job that a limited queue could not govern alone.

    A job in a queue with ``DISPATCH["QUEUES"]`` limits is admitted by the
    queue's gate; one job under two gates (its task's limits and its
    queue's) could be blocked by one and promoted by the other over and
    over, so the combination is refused: give such a task a queue of its
    own. Partition keys (their own blocking and promotion) and resource
    needs (their own claim) are refused for the same reason.
    """
    limits = queue_limits()
    if not limits or task.queue_name not in limits:
        return
    what = None
    if getattr(task, "concurrency_limit", None) is not None:
        what = "a concurrency_limit"
    elif getattr(task, "rate_limit", None) is not None:
        what = "a rate_limit"
    elif getattr(task, "partition_key", None) is not None:
        what = "a partition_key"
    elif getattr(task, "resources", None):
        what = "resources"
    if what is not None:
        raise InvalidTask(
            f"queue {task.queue_name!r} has limits in DISPATCH['QUEUES'], and a job of it "
            f"cannot also have {what} ({task.module_path}): its queue's limits would be "
            "a second gate on it. Enqueue it to a queue without limits, or drop one of them."
        )
