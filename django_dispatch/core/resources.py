"""Resource needs and worker capacity: validation and arithmetic, no I/O.

A job's *needs* (``@task(resources={"memory_mb": 2048, "gpu": 1})``) and a
worker's *capacity* (``rundispatch --capacity memory_mb=8192,gpu=1``) are
dicts of names to non-negative whole numbers. Names are free: a need whose
name the worker's capacity lacks counts against a capacity of 0. A job fits
a worker when every need is at most what the worker has free (its capacity
minus what its running jobs hold).

Jobs with needs carry a *shape*: a 63-bit hash of their canonical needs, so
every job with the same needs shares one, and the claim can list the shapes
pending (a few) before reading any job (see ``store.resources``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from ..compat import InvalidTask

Needs = dict[str, int]

#: ``resources="auto"``: needs derived from the task's usage history.
AUTO = "auto"
#: How many of the newest usage records ``auto`` reads.
AUTO_HISTORY = 20
#: Fewer records than this: no needs yet (the job runs anywhere, like a task
#: without ``resources``), until enough attempts have been measured.
AUTO_MIN_HISTORY = 3
#: Longest name of a resource or of a locality.
NAME_MAX_LENGTH = 100
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def check_needs(value: Any, *, what: str = "resources") -> Needs | None:
    """``value`` as needs (None or ``{}``: no needs); InvalidTask saying what is wrong."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidTask(
            f"{what} must be a dict of resource names to whole numbers, e.g. "
            f'{{"memory_mb": 2048, "gpu": 1}}, or "auto"; got {value!r}.'
        )
    needs: Needs = {}
    for name, amount in value.items():
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or len(name) > 100:
            raise InvalidTask(
                f"{what}: resource name {name!r} is not valid: letters, digits, '_', '.' "
                "or '-', starting with a letter or '_'."
            )
        if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
            raise InvalidTask(
                f"{what}[{name!r}] must be a non-negative whole number, got {amount!r}."
            )
        if amount:  # a need of 0 is no need: it must not split the shape
            needs[name] = amount
    return needs or None


def check_locality(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > NAME_MAX_LENGTH:
        raise InvalidTask(
            f"locality must be a non-empty string of at most {NAME_MAX_LENGTH} characters, "
            f"got {value!r}."
        )
    return value


def parse_capacity(text: str) -> Needs:
    """``"memory_mb=8192,gpu=1"`` as a capacity; ValueError saying what is wrong."""
    capacity: Needs = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, amount = part.partition("=")
        name, amount = name.strip(), amount.strip()
        if not sep or not _NAME_RE.fullmatch(name) or not re.fullmatch(r"\d+", amount):
            raise ValueError(
                f"capacity {part!r} is not NAME=WHOLE_NUMBER: write e.g. "
                "--capacity memory_mb=8192,gpu=1 (non-negative whole numbers)."
            )
        capacity[name] = int(amount)
    return capacity


def check_capacity(value: Any, *, what: str = 'DISPATCH["CAPACITY"]') -> Needs:
    """A capacity from settings: a dict (or the ``--capacity`` text)."""
    if isinstance(value, str):
        return parse_capacity(value)
    try:
        return check_needs(value, what=what) or {}
    except InvalidTask as e:
        raise ValueError(str(e)) from None


def key_of(needs: Mapping[str, int]) -> str:
    return json.dumps(dict(sorted(needs.items())), separators=(",", ":"))


def shape_of(needs: Mapping[str, int] | None) -> int | None:
    """The shape id of ``needs``: a positive 63-bit hash of their canonical JSON."""
    if not needs:
        return None
    digest = hashlib.sha256(key_of(needs).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def fits(needs: Mapping[str, int] | None, free: Mapping[str, int]) -> bool:
    """Whether ``needs`` fit in ``free`` (a name ``free`` lacks has 0)."""
    return not needs or all(amount <= free.get(name, 0) for name, amount in needs.items())


def minus(free: Mapping[str, int], needs: Mapping[str, int] | None) -> Needs:
    out = dict(free)
    for name, amount in (needs or {}).items():
        out[name] = out.get(name, 0) - amount
    return out


def divide(capacity: Mapping[str, int], processes: int) -> Needs:
    """Each of ``processes`` children's share of a host's capacity (rounded down).

    ``--capacity`` describes the whole host, as an operator thinks of it;
    ``--processes N`` gives each child an Nth, so the children together
    never promise more than the host has. A job needing more than one share
    fits no child: give such a host one process, or more capacity.
    """
    return {name: amount // max(1, processes) for name, amount in capacity.items()}


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile (``fraction`` in 0..1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * fraction // 1))  # ceil without floats drifting
    return ordered[int(rank) - 1]


class FrozenNeeds(dict[str, int]):
    """A task's ``resources`` dict, hashable: Tasks are frozen dataclasses that
    the backend keeps enqueue plans for, by equality. Never mutated after
    the task is built."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))
