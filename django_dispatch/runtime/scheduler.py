"""The cron scheduler: every worker ticks; row locks make each slot fire once.

A tick claims due entries (``FOR UPDATE SKIP LOCKED``), enqueues one job per
slot to fire, and advances the entry's watermark, all in one transaction: a
crash anywhere rolls all of it back and the next tick (here or on another
worker) fires the slot. Losing the race for an entry is the normal case and
is silent. Time is the database's.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connections, transaction

from .. import store
from ..compat import TaskResult, task_enqueued
from ..conf import get_settings
from ..core import cron
from ..models import CronEntry
from ..services import cron_task
from ..tasks.registry import DispatchBackendBase, alias_serving, namespace_for
from ..tasks.results import result_from_job, send_robust, signal_sender

logger = logging.getLogger("django_dispatch.scheduler")

#: Entries handled per tick.
TICK_LIMIT = 100
#: When an entry cannot be scheduled (bad expression saved around the
#: admin's validation, task gone), it is looked at again after this long.
RETRY_BROKEN_AFTER = timedelta(minutes=1)


def settings_entries(namespace: str) -> dict[str, dict[str, Any]]:
    """The ``DISPATCH["CRON"]`` entries of ``namespace``: those whose ``"backend"``
    alias (default ``"default"``) has that namespace."""
    entries = {}
    for name, spec in get_settings().CRON.items():
        alias = spec.get("backend", "default") if isinstance(spec, dict) else "default"
        try:
            if namespace_for(alias) == namespace:
                entries[name] = spec
        except ValueError:
            logger.error("DISPATCH['CRON'][%r] was skipped: %s", name, "its backend is unknown")
    return entries


def sync_from_settings(namespace: str = "") -> None:
    """Create/update ``namespace``'s entries from ``DISPATCH["CRON"]``; disable removed ones."""
    entries = settings_entries(namespace)
    for _ in range(3):  # several workers starting at once race on the inserts
        try:
            with transaction.atomic(using=store.db_alias()):
                created, updated, disabled = store.cron_sync_from_settings(
                    entries, default_timezone=settings.TIME_ZONE, namespace=namespace
                )
            break
        except IntegrityError:
            continue
    else:
        return
    if created or updated or disabled:
        logger.info(
            "cron entries from settings: %s created, %s updated, %s disabled",
            created,
            updated,
            disabled,
        )


def tick(namespace: str = "") -> int:
    """Fire every due slot of every due entry of ``namespace``; return how many
    jobs were enqueued (in that namespace)."""
    db = store.db_alias()
    if not store.cron_entries_due_exist(db=db, namespace=namespace):  # most ticks: one read
        return 0
    enqueued: list[TaskResult] = []
    with transaction.atomic(using=db):
        entries = store.cron_entries_claim_due(limit=TICK_LIMIT, db=db, namespace=namespace)
        if not entries:
            return 0
        now: datetime = entries[0].db_now  # type: ignore[attr-defined]
        grace = _grace()
        for entry in entries:
            enqueued += _fire(entry, now, grace, db)
    if enqueued:
        # task_enqueued receivers are user code: after the commit, and never
        # on the worker's control loop (they could delay its heartbeats).
        threading.Thread(target=_signal_enqueued, args=(enqueued,), daemon=True).start()
    return len(enqueued)


def _signal_enqueued(results: list[TaskResult]) -> None:
    try:
        for result in results:
            send_robust(task_enqueued, signal_sender(result.task), result)
    finally:
        connections.close_all()


def _grace() -> timedelta:
    """How late a slot may be and still count as on time, not missed.

    Ticks are not instantaneous and a worker may pause; a slot found within
    this window always fires, whatever the misfire policy. Only downtime
    longer than this counts as missed slots.
    """
    cfg = get_settings()
    return timedelta(seconds=max(cfg.LEASE_SECONDS, 10 * cfg.SCHEDULER_INTERVAL))


def _fire(entry: CronEntry, now: datetime, grace: timedelta, db: str) -> list[TaskResult]:
    """Enqueue the entry's due slots and move its watermark; all or nothing.

    The slots share one savepoint: if any of them cannot be enqueued, none
    is, and the entry is looked at again after ``RETRY_BROKEN_AFTER`` (a slot
    enqueued before the failure would otherwise fire twice).
    """
    enqueued: list[TaskResult] = []
    try:
        slots, next_run_at = cron.slots_to_fire(
            entry.schedule,
            entry.timezone,
            last_slot=entry.last_slot,
            now=now,
            policy=entry.misfire_policy,
            grace=grace,
            # A next run without a watermark: a first fire set from code
            # (``schedules.set_enabled(..., next_run_at=)``), due at that instant.
            first=entry.next_run_at if entry.last_slot is None else None,
        )
        with transaction.atomic(using=db):
            for slot in slots:
                result = _enqueue(entry, f"cron:{entry.name}:{slot.isoformat()}", db)
                if result is not None:
                    enqueued.append(result)
    except Exception:
        logger.exception(
            "cron entry %r could not be scheduled; retrying in %s", entry.name, RETRY_BROKEN_AFTER
        )
        store.cron_entry_advance(
            entry.pk,
            last_slot=entry.last_slot or now,
            next_run_at=now + RETRY_BROKEN_AFTER,
            fired_slot=None,
            db=db,
        )
        return []
    watermark = cron.latest_slot(entry.schedule, entry.timezone, now) or entry.last_slot or now
    store.cron_entry_advance(
        entry.pk,
        last_slot=max(watermark, *slots) if slots else watermark,
        next_run_at=next_run_at,
        fired_slot=slots[-1] if slots else None,
        db=db,
    )
    for slot in slots:
        logger.info("cron entry %r fired for %s", entry.name, slot.isoformat())
    return enqueued


def _enqueue(entry: CronEntry, key: str, db: str) -> TaskResult | None:
    """Insert one slot's job (no signal here); None if its key was already live."""
    task = cron_task(entry, idempotency_key=key)
    backend = task.get_backend()
    if not isinstance(backend, DispatchBackendBase):
        raise TypeError(f"{entry.task_path} does not use a DispatchBackend")
    job = backend.build_job(task, entry.args, entry.kwargs)
    job.namespace = entry.namespace  # the entry's namespace, whatever the task's backend
    job.backend = alias_serving(entry.namespace, job.backend)
    job, created = store.job_insert_idempotent(job, db=db)
    return result_from_job(job, task=task) if created else None
