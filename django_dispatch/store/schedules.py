"""Cron entries: syncing from settings, claiming due entries, advancing them."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.db.models.functions import Now

from ..models import CronEntry
from .base import db_alias, take_sqlite_write_lock

logger = logging.getLogger("django_dispatch.scheduler")


def _entry_values(spec: Mapping[str, Any], default_timezone: str) -> dict[str, Any]:
    return {
        "schedule": str(spec["schedule"]),
        "timezone": spec.get("timezone") or default_timezone,
        "task_path": str(spec["task"]),
        "args": list(spec.get("args", [])),
        "kwargs": dict(spec.get("kwargs", {})),
        "queue_name": str(spec.get("queue_name", "default")),
        "priority": int(spec.get("priority", 0)),
        "misfire_policy": spec.get("misfire_policy", "skip"),
        "enabled": bool(spec.get("enabled", True)),
        "source": CronEntry.Source.SETTINGS,
    }


def cron_sync_from_settings(
    entries: Mapping[str, Mapping[str, Any]],
    *,
    default_timezone: str,
    db: str | None = None,
    namespace: str = "",
) -> tuple[int, int, int]:
    """Make ``namespace``'s entries match ``entries`` (the ``DISPATCH["CRON"]``
    entries of that namespace); return (created, updated, disabled).

    Entries removed from settings are disabled, never deleted, so their
    history stays visible; entries created in the admin are left alone. An
    entry whose schedule or time zone changed, or that is enabled again,
    starts afresh from now: slots of the old schedule are not replayed.
    """
    db = db or db_alias()
    take_sqlite_write_lock(db)  # several workers sync at once on start-up
    created = updated = 0
    for name, spec in entries.items():
        try:
            values = _entry_values(spec, default_timezone)
        except KeyError as e:
            logger.error(
                "DISPATCH['CRON'][%r] was skipped: it has no %r key. Run `manage.py check` "
                "for every problem in DISPATCH.",
                name,
                e.args[0],
            )
            continue
        except (TypeError, ValueError) as e:
            logger.error(
                "DISPATCH['CRON'][%r] was skipped: a value has the wrong type (%s). Run "
                "`manage.py check` for every problem in DISPATCH.",
                name,
                e,
            )
            continue
        entry = CronEntry.objects.using(db).filter(namespace=namespace, name=name).first()
        if entry is None:
            CronEntry.objects.using(db).create(namespace=namespace, name=name, **values)
            created += 1
            continue
        if entry.source == CronEntry.Source.CODE:
            _skip_code_entry(name)
            continue
        schedule_changed = (entry.schedule, entry.timezone) != (
            values["schedule"],
            values["timezone"],
        )
        if schedule_changed or (values["enabled"] and not entry.enabled):
            # Start afresh from now: the old watermark would make the new
            # schedule (or a re-enabled one) fire every slot since then.
            values.update(next_run_at=None, last_slot=None)
        if any(getattr(entry, k) != v for k, v in values.items()):
            CronEntry.objects.using(db).filter(pk=entry.pk).update(updated_at=Now(), **values)
            updated += 1
    disabled = (
        CronEntry.objects.using(db)
        .filter(namespace=namespace, source=CronEntry.Source.SETTINGS, enabled=True)
        .exclude(name__in=list(entries))
        .update(enabled=False, updated_at=Now())
    )
    return created, updated, disabled


def _skip_code_entry(name: str) -> None:
    """``schedules.save`` refuses names the settings define, so this is a name
    added to the settings after code made it: the code keeps it."""
    logger.error(
        "DISPATCH['CRON'][%r] was skipped: an entry of that name was made in code "
        "(schedules.save) and the settings never change those. Rename one of them, "
        "or delete the code's with schedules.delete(%r).",
        name,
        name,
    )


def cron_entry_save(
    namespace: str, name: str, values: Mapping[str, Any], *, db: str | None = None
) -> CronEntry:
    """Insert or update entry ``name`` of ``namespace`` as made in code; return it.

    Call inside ``transaction.atomic()``. As the settings sync does, a new
    schedule or time zone, or an entry enabled again, starts afresh from now
    (no slot of the old schedule fires); otherwise the watermark stays.
    """
    db = db or db_alias()
    take_sqlite_write_lock(db)
    values = {**values, "source": CronEntry.Source.CODE}
    rows = CronEntry.objects.using(db).filter(namespace=namespace, name=name)
    entry = rows.select_for_update().first()
    if entry is None:
        return CronEntry.objects.using(db).create(namespace=namespace, name=name, **values)
    restart = (entry.schedule, entry.timezone) != (values["schedule"], values["timezone"])
    if restart or (values["enabled"] and not entry.enabled):
        values.update(next_run_at=None, last_slot=None)
    rows.update(updated_at=Now(), **values)
    return rows.get()


def cron_entry_delete_named(namespace: str, name: str, *, db: str | None = None) -> bool:
    """Delete entry ``name`` of ``namespace``; False when there is none."""
    deleted, _ = (
        CronEntry.objects.using(db or db_alias()).filter(namespace=namespace, name=name).delete()
    )
    return deleted > 0


def cron_entry_set_enabled_named(
    namespace: str,
    name: str,
    enabled: bool,
    *,
    next_run_at: datetime | None = None,
    db: str | None = None,
) -> bool:
    """Enable or disable entry ``name``; True when this call changed it.

    Enabling recomputes its next run from now, unless ``next_run_at`` is
    given: then it fires first at that instant (a next run without a
    watermark, see ``core.cron.slots_to_fire``), then on its schedule.
    """
    rows = CronEntry.objects.using(db or db_alias()).filter(namespace=namespace, name=name)
    if next_run_at is not None:
        return (
            rows.update(enabled=True, next_run_at=next_run_at, last_slot=None, updated_at=Now())
            == 1
        )
    changes: dict[str, Any] = {"enabled": enabled, "updated_at": Now()}
    if enabled:
        changes.update(next_run_at=None, last_slot=None)
    return rows.exclude(enabled=enabled).update(**changes) == 1


def _due(db: str, namespace: str):
    return CronEntry.objects.using(db).filter(
        Q(next_run_at__lte=Now()) | Q(next_run_at__isnull=True),
        namespace=namespace,
        enabled=True,
    )


def cron_entries_due_exist(*, db: str | None = None, namespace: str = "") -> bool:
    """One cheap read, outside any transaction: is any entry of ``namespace`` due?"""
    return _due(db or db_alias(), namespace).exists()


def cron_entries_claim_due(
    *, limit: int, db: str | None = None, namespace: str = ""
) -> list[CronEntry]:
    """``namespace``'s enabled entries that are due (or never scheduled), locked,
    skipping locked ones.

    Call inside ``transaction.atomic()``: the row locks make every slot fire
    once, however many schedulers tick at the same time. Each entry carries
    ``db_now``, the database clock, for the slot arithmetic.
    """
    db = db or db_alias()
    take_sqlite_write_lock(db)  # before any read, or SQLite cannot upgrade later
    return list(
        _due(db, namespace)
        .order_by("next_run_at")
        .select_for_update(skip_locked=True)
        .annotate(db_now=Now())[:limit]
    )


def cron_entry_advance(
    entry_id: int,
    *,
    last_slot: datetime,
    next_run_at: datetime,
    fired_slot: datetime | None,
    db: str | None = None,
) -> None:
    """Move an entry's watermark on, in the transaction that enqueued its jobs."""
    changes: dict[str, Any] = {"last_slot": last_slot, "next_run_at": next_run_at}
    if fired_slot is not None:
        changes["last_run_at"] = fired_slot
    CronEntry.objects.using(db or db_alias()).filter(id=entry_id).update(**changes)


def cron_entries_delete(
    entry_ids: list[int], *, keep_names: Iterable[str], db: str | None = None
) -> int:
    """Delete entries, except those named in ``keep_names``; return how many went.

    ``keep_names`` are the entries still defined in ``DISPATCH["CRON"]``: the
    next worker start would create them again, with a fresh schedule, so
    deleting them would only reset them. A tick that holds an entry's row lock
    (``cron_entries_claim_due``) finishes first; the jobs it enqueued stay.
    """
    deleted, _ = (
        CronEntry.objects.using(db or db_alias())
        .filter(id__in=entry_ids)
        .exclude(name__in=list(keep_names))
        .delete()
    )
    return deleted


def cron_entries_set_enabled(entry_ids: list[int], enabled: bool, *, db: str | None = None) -> int:
    """Enable or disable entries. Re-enabling recomputes the next run from now
    (slots missed while disabled are not fired)."""
    changes: dict[str, Any] = {"enabled": enabled, "updated_at": Now()}
    if enabled:
        changes.update(next_run_at=None, last_slot=None)
    return (
        CronEntry.objects.using(db or db_alias())
        .filter(id__in=entry_ids)
        .exclude(enabled=enabled)
        .update(**changes)
    )
