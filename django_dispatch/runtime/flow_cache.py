"""A worker's view of flow control: the paused queues and waiting groups it claims by.

The claim must leave paused queues out and promote set-aside jobs first, but
reading both on every claim would be a query per claim. So each process
keeps a ``FlowState`` per (database, namespace), read with
``store.flow_state_read`` when older than the poll interval, and passes it
to ``store.jobs_claim``, which notes what it learns (it set jobs aside, or
the last group stopped waiting). Each claim gets its own copy of the state,
and what it learnt is written back to the process's current entry
(``jobs_claim``): claims of one process may race (threads, a refresh in
between), and a note written to a copy that a refresh had replaced would be
lost, leaving set-aside jobs unpromoted until the next refresh. A pause or resume is announced to
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
from collections.abc import Sequence
from dataclasses import replace

from django.db import transaction

from ..conf import queue_limits
from ..store.claim import jobs_claim as store_jobs_claim
from ..store.flow import flow_state_read
from ..store.staging import STAGE_BATCH, jobs_stage_due
from ..store.types import ClaimedJob, FlowState, Placement

#: ``(db, namespace) -> (read at, state)``; ``read at`` is monotonic, taken before the read.
_cache: dict[tuple[str, str], tuple[float, FlowState]] = {}
#: ``(db, namespace) -> when this process's claims last staged due scheduled
#: jobs`` (monotonic). A claim stages at most once per half poll interval:
#: an idle worker's every poll stages, so a deferred job starts within one
#: poll interval of being due, and a busy worker's waves (hundreds a second)
#: do not each pay the stager's statement (docs/performance.md, "The
#: scheduled state").
_staged_at: dict[tuple[str, str], float] = {}
#: The ``(db, namespace)`` whose last staging pass staged a full batch: more
#: may be due, so the next claim stages again without waiting for the
#: throttle; a burst of due jobs is staged as fast as claims take them, not
#: ``STAGE_BATCH`` per half poll interval.
_staging_behind: set[tuple[str, str]] = set()
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
        return replace(entry[1], limits=queue_limits())
    state = flow_state_read(db, namespace)
    with _lock:
        if now > _invalidated_at:
            _cache[key] = (now, replace(state))
    return state


def _take_stage_turn(key: tuple[str, str], max_age: float) -> bool:
    """Whether this claim stages (the throttle), counting it as done if so."""
    now = time.monotonic()
    with _lock:
        stage = key in _staging_behind or now - _staged_at.get(key, -max_age) >= max_age / 2
        if stage:
            _staged_at[key] = now
    return stage


def _staged(key: tuple[str, str], staged: int) -> None:
    """After a staging pass: a full batch means more may be due (stage again at once)."""
    with _lock:
        if staged >= STAGE_BATCH:
            _staging_behind.add(key)
        else:
            _staging_behind.discard(key)


def stage_if_due(db: str, namespace: str, max_age: float) -> None:
    """The stager's turn before a one-statement wave (``store.wave``), which
    does not stage: in a statement of its own, committed before the wave, so
    the wave's claim sees what it staged and the wave stays one statement.

    Called outside any transaction: staging commits at once (its NOTIFY is
    sent then), and holds its row locks for that statement only."""
    key = (db, namespace)
    if _take_stage_turn(key, max_age):
        _staged(key, jobs_stage_due(db=db, namespace=namespace, limit=STAGE_BATCH))


def jobs_claim(
    *,
    worker_id: str,
    queues: Sequence[str],
    limit: int,
    lease_seconds: float,
    db: str,
    namespace: str,
    max_age: float,
    placement: Placement | None = None,
) -> list[ClaimedJob]:
    """``store.jobs_claim`` with this process's flow state, as a worker claims.

    If the claim set jobs aside (some group waits now) or found no group
    waiting any more, the process's current entry learns it at once, so its
    next claims promote (or stop promoting) without waiting for a refresh.
    """
    handed: list[tuple[FlowState, bool]] = []  # the state, and its waiting when handed

    def flow(db: str, namespace: str) -> FlowState:
        state = flow_for_claim(db, namespace, max_age)
        handed.append((state, state.waiting))
        return state

    key = (db, namespace)
    stage = _take_stage_turn(key, max_age)
    # One transaction, as store.jobs_claim's own staging: the claim sees what
    # was staged; here the count tells whether the stager fell behind.
    with transaction.atomic(using=db, savepoint=False):
        staged = jobs_stage_due(db=db, namespace=namespace, limit=STAGE_BATCH) if stage else 0
        claimed = store_jobs_claim(
            worker_id=worker_id,
            queues=queues,
            limit=limit,
            lease_seconds=lease_seconds,
            db=db,
            namespace=namespace,
            flow=flow,
            placement=placement,
            stage=0,
        )
    if stage:
        _staged(key, staged)
    for state, waiting in handed:
        if state.waiting != waiting:  # the claim learnt something: tell the current entry
            with _lock:
                entry = _cache.get((db, namespace))
                if entry is not None:
                    entry[1].waiting = state.waiting
    return claimed
