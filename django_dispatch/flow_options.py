"""Flow-control task options (issue #17), validated without the database.

``@task(concurrency_limit=N)`` with ``.using(concurrency_key=...)``: at most
N jobs of the task run at once per key, across the cluster (enforced by the
claim, see ``store.flow``). Rows carry their limit and key so that the claim
needs no task import; a task without a limit adds no column value at all
(``concurrency_columns`` is empty), so plain enqueues are unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from .compat import InvalidTask, Task

#: Seconds per unit of a rate string.
RATE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")


def parse_rate(rate: object) -> tuple[int, int]:
    """``"N/unit"`` or ``"N/Kunit"`` (unit: s, m, h, d) -> (N starts, window seconds).

    ``"100/m"``: at most 100 starts per minute; ``"10/5s"``: 10 per 5 seconds.
    A ValueError saying what is accepted otherwise.
    """
    match = _RATE_RE.match(rate) if isinstance(rate, str) else None
    count = int(match.group(1)) if match else 0
    period = (int(match.group(2) or 1) * RATE_UNITS[match.group(3)]) if match else 0
    if not match or count < 1 or period < 1:
        raise ValueError(
            f"rate limit {rate!r} does not parse: write starts per window as 'N/unit' "
            "or 'N/Kunit' with N >= 1 and unit s, m, h or d (e.g. '100/m', '10/5s')."
        )
    return count, period


def check_concurrency(task: Task) -> None:
    """InvalidTask, saying what to change, for concurrency or rate options that cannot work.

    A ``concurrency_key`` needs a limit (a key alone would limit nothing); a
    partition key already means one at a time in order, so both on one job
    would be two gates with different promotion rules; jobs with resource
    needs are claimed by their own path (#16), which does not apply limits,
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


# --- queue-level limits: DISPATCH["QUEUES"] ----------------------------------------


@dataclass(frozen=True, slots=True)
class QueueLimit:
    """One queue's limits from ``DISPATCH["QUEUES"]`` (None: no such cap)."""

    concurrency: int | None = None
    rate_limit: int | None = None
    rate_period: int | None = None
    #: The rate as the settings give it (``"10/s"``), for operators.
    rate: str | None = None


#: The keys a queue's dict may hold.
QUEUE_LIMIT_KEYS = ("concurrency", "rate_limit")


def queue_limit_problems(name: object, spec: object) -> list[tuple[str, str]]:
    """What is wrong with one ``DISPATCH["QUEUES"]`` entry: ``(check id, message)`` pairs.

    Shared by the system checks (``checks.check_queue_limits``) and
    ``queue_limits``, which leaves a bad entry out rather than guess.
    """
    from .conf import did_you_mean

    where = f"DISPATCH['QUEUES'][{name!r}]"
    if not isinstance(name, str) or not name or len(name) > 100:
        return [
            (
                "E060",
                f"DISPATCH['QUEUES'] has key {name!r}; a queue name is a non-empty "
                "string of at most 100 characters.",
            )
        ]
    if not isinstance(spec, dict):
        return [
            (
                "E060",
                f"{where} must be a dict such as {{'concurrency': 5, 'rate_limit': "
                f"'10/s'}}, got {type(spec).__name__} {spec!r}.",
            )
        ]
    problems = [
        (
            "E061",
            f"{where} has an unknown key {key!r}.{did_you_mean(key, QUEUE_LIMIT_KEYS)} "
            f"A queue's limits are {' and '.join(map(repr, QUEUE_LIMIT_KEYS))}.",
        )
        for key in sorted(set(spec) - set(QUEUE_LIMIT_KEYS), key=str)
    ]
    if "rate_limit" in spec:
        try:
            parse_rate(spec["rate_limit"])
        except ValueError as e:
            problems.append(("E062", f"{where}: {e}"))
    if "concurrency" in spec:
        value = spec["concurrency"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(
                (
                    "E063",
                    f"{where}: 'concurrency' must be a whole number of at least 1 (jobs of "
                    f"the queue running at once), got {value!r}. Leave the key out for no cap.",
                )
            )
    return problems


_queue_limits: dict[str, QueueLimit] | None = None


def queue_limits() -> dict[str, QueueLimit]:
    """The valid entries of ``DISPATCH["QUEUES"]`` that limit something, parsed.

    Read on every claim and enqueue, so kept until Django reports a change
    of ``DISPATCH`` (an empty dict on a site without queue limits: the
    claim then runs exactly as before). Entries the system checks reject
    are left out (the checks stop ``rundispatch`` from starting anyway).
    """
    global _queue_limits
    limits = _queue_limits
    if limits is None:
        from django.conf import settings

        raw = getattr(settings, "DISPATCH", None) or {}
        queues = raw.get("QUEUES") if isinstance(raw, dict) else None
        limits = {}
        for name, spec in (queues or {}).items() if isinstance(queues, dict) else ():
            if queue_limit_problems(name, spec):
                continue
            rate, period = parse_rate(spec["rate_limit"]) if "rate_limit" in spec else (None, None)
            if spec.get("concurrency") is not None or rate is not None:
                text = "".join(spec["rate_limit"].split()) if rate is not None else None
                limits[name] = QueueLimit(spec.get("concurrency"), rate, period, text)
        _queue_limits = limits
    return limits


@receiver(setting_changed)
def _forget_queue_limits(*, setting: str, **kwargs: Any) -> None:
    """A new ``DISPATCH`` (tests' ``override_settings``): read the limits again, and
    forget the backends' enqueue plans, whose validation (``check_queue_of``)
    depended on them."""
    global _queue_limits
    if setting != "DISPATCH":
        return
    _queue_limits = None
    from django.conf import settings

    from .enqueue import backend_for

    for alias in getattr(settings, "TASKS", None) or {}:
        backend = backend_for(alias)
        if backend is not None:
            backend._plans.clear()


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
