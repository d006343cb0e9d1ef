"""Retry policy: pure functions, no database.

A backoff is ``fn(exception, task_result) -> seconds | None`` (the shape of
Django's open proposal for Tasks retries, django/new-features #142): the
number of seconds to wait before the next attempt, or None to stop retrying.
"""

import random
from collections.abc import Callable
from typing import Any

from ..compat import TaskResult

Backoff = Callable[[BaseException, TaskResult], float | None]

BASE_SECONDS = 1.0
CAP_SECONDS = 3600.0


def exponential_backoff(exception: BaseException, task_result: TaskResult) -> float:
    """Default backoff: 1 s, 2 s, 4 s, … capped at an hour, jittered over the upper half.

    Jitter spreads retries of jobs that failed together (a database outage)
    so they do not all come back in the same second.
    """
    failures = max(1, len(task_result.errors))
    ceiling = min(CAP_SECONDS, BASE_SECONDS * 2 ** (failures - 1))
    return random.uniform(ceiling / 2, ceiling)


def next_delay(
    *,
    attempts: int,
    max_attempts: int,
    backoff: Backoff,
    exception: BaseException,
    task_result: TaskResult,
) -> float | None:
    """Seconds until the next attempt, or None when the job has failed for good."""
    if attempts >= max_attempts:
        return None
    delay: Any = backoff(exception, task_result)
    if delay is None:
        return None
    return max(0.0, float(delay))
