"""How long a failed step waits before its next attempt.

Pure functions of the stored ``backoff`` option and the attempt number: the
definition validates the option with them in view, and the attempt code
reads them when a step fails, neither having to import the other.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from django.utils.module_loading import import_string

#: ``fn(attempt) -> seconds``: the delay after failed attempt number ``attempt``.
BackoffFunction = Callable[[int], float]

BACKOFF_CAP_SECONDS = 3600.0


def default_backoff(attempt: int) -> float:
    """About 1 s, 2 s, 4 s, ... after failed attempt 1, 2, 3, ..., capped at an hour."""
    ceiling = min(BACKOFF_CAP_SECONDS, 2.0 ** (max(1, attempt) - 1))
    return random.uniform(ceiling / 2, ceiling)


def backoff_delay(backoff: float | str | None, attempt: int) -> float:
    """Seconds to wait after failed attempt ``attempt`` under a stored backoff."""
    if backoff is None:
        return default_backoff(attempt)
    if isinstance(backoff, int | float):
        return max(0.0, float(backoff))
    function = import_string(backoff)
    return max(0.0, float(function(attempt)))
