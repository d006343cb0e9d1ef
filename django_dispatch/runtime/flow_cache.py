"""A worker's view of flow control: the paused queues and waiting groups it claims by.

The claim must leave paused queues out and promote set-aside jobs first, but
reading both on every claim would be a query per claim. So each process
keeps a ``FlowState`` per (database, namespace), read with
``store.flow_state_read`` when older than the poll interval, and passes it
to ``store.jobs_claim``; the claim writes back what it learns (it set jobs
aside, or the last group stopped waiting). A pause or resume is announced to
listening workers (PostgreSQL NOTIFY), whose listener calls
``forget_paused``, and ``pause_queue``/``resume_queue`` call it in their own
process: so a pause takes effect within one poll interval everywhere, and
at once where it is announced.

The entry is stamped with the time *before* its read, and an invalidation is
stamped too; an entry is used only if it was read after the last
invalidation. So a refresh that raced a NOTIFY (its read began before the
pause committed) is never taken for fresh.
"""

from __future__ import annotations

import threading
import time

from ..conf import queue_limits
from ..store.flow import flow_state_read
from ..store.types import FlowState

#: ``(db, namespace) -> (read at, state)``; ``read at`` is monotonic, taken before the read.
_cache: dict[tuple[str, str], tuple[float, FlowState]] = {}
_invalidated_at = 0.0
_lock = threading.Lock()


def forget_paused() -> None:
    """Invalidate every cached state: the next claim reads it again.

    Called from the listener thread on a flow notification; safe from any thread.
    """
    global _invalidated_at
    with _lock:
        _invalidated_at = time.monotonic()
        _cache.clear()


def flow_for_claim(db: str, namespace: str, max_age: float) -> FlowState:
    """The flow state the next claim of ``namespace`` should use.

    From the cache when younger than ``max_age`` seconds (the poll interval)
    and read after the last invalidation; otherwise read now. The queue
    limits are ``conf``'s, always current (a settings change applies at the
    next claim, as ``conf`` forgets its parse on ``setting_changed``).
    """
    key = (db, namespace)
    now = time.monotonic()
    entry = _cache.get(key)
    if entry is not None and now - entry[0] < max_age and entry[0] > _invalidated_at:
        state = entry[1]
        state.limits = queue_limits()
        return state
    state = flow_state_read(db, namespace)
    with _lock:
        if now > _invalidated_at:
            _cache[key] = (now, state)
    return state
