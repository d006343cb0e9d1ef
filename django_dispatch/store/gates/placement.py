"""The placement gate: of a claim's candidates, only what fits this worker together.

A worker with ``--capacity`` reads only jobs whose needs fit what it has
free (``sources.resources``), one by one; this keeps, greedily in claim
order, those that fit *together*, and records what the claimed ones hold,
so the next claim of this worker sees less room.
"""

from __future__ import annotations

from typing import Any

from ...core.resources import fits, minus
from ..types import Placement


def fit(
    placement: Placement, rows: list[dict[str, Any]], slots: int
) -> tuple[list[dict[str, Any]], list[int]]:
    """(at most ``slots`` rows that fit together, greedily in order; ids of the rest)."""
    free = placement.free
    taken: list[dict[str, Any]] = []
    left: list[int] = []
    for row in rows:
        needs = row.get("resources")
        if len(taken) < slots and fits(needs, free):
            taken.append(row)
            free = minus(free, needs)
        else:
            left.append(row["id"])
    placement.held = minus(placement.capacity, free)
    return taken, left
