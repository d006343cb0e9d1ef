"""Rates: how many starts per window, parsed from ``"N/unit"`` strings.

A task's ``rate_limit`` and a queue's ``DISPATCH["QUEUES"]`` rate share
this one grammar, so a rate that the system checks accept is the rate the
claim enforces.
"""

from __future__ import annotations

import re

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
