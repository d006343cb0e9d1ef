"""``DISPATCH["QUEUES"]`` entries: their parsed form and what is wrong with one.

Pure: ``conf.queue_limits`` reads the setting and keeps the valid entries;
the system checks (``checks.queues``) report the problems found here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .rates import parse_rate
from .suggest import did_you_mean


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
