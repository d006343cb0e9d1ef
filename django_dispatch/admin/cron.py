"""The cron entries admin: define entries, enable/disable them, run one now.

The add/change form saves only the entry's definition (validated by
``CronEntryForm``); the schedule state (watermark, next/last run) belongs
to the scheduler, and enabling, disabling and running now go through the
services, which keep that state consistent (re-enabling does not fire the
slots missed while disabled). Enabling is therefore read-only on the change
form and done with the actions instead.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib import admin, messages
from django.db.models.functions import Now
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from .. import services
from ..compat import admin_action
from ..core import cron
from ..models import CronEntry, Job
from ..store import db_alias
from .aliases import AliasSelector
from .common import BOTH, DeleteThroughAction, SQLiteWriteLockFirst, link, selected_ids
from .forms import CronEntryForm
from .history import record

logger = logging.getLogger("django_dispatch.admin")

PREVIEW_COUNT = 5

DEFINITION = [
    ("name", "namespace"),
    ("schedule", "timezone"),
    "task_path",
    ("args", "kwargs"),
    ("queue_name", "priority", "misfire_policy"),
]
SCHEDULE_STATE = [
    ("enabled", "source"),
    ("next_run_at", "last_run_at", "last_slot"),
    ("created_at", "updated_at"),
]
SCHEDULE_STATE_FIELDS = [name for row in SCHEDULE_STATE for name in row]


def upcoming(entry: CronEntry, after: datetime, count: int = PREVIEW_COUNT) -> list[datetime]:
    """The entry's next ``count`` slots after ``after`` (aware UTC)."""
    times: list[datetime] = []
    for _ in range(count):
        after = cron.next_fire(entry.schedule, entry.timezone, after)
        times.append(after)
    return times


#: Fields an operator edits; everything else belongs to the scheduler.
#: (``enabled`` changes only through the enable/disable actions.)
DEFINITION_FIELDS = set(CronEntryForm.Meta.fields) - {"enabled"}


@admin.register(CronEntry)
class CronEntryAdmin(AliasSelector, SQLiteWriteLockFirst, DeleteThroughAction, admin.ModelAdmin):
    form = CronEntryForm
    list_display = [
        "name",
        "namespace",
        "schedule",
        "timezone",
        "task_path",
        "enabled",
        "next_run_at",
        "last_run_at",
        "source",
        "fired_jobs",
    ]
    list_filter = ["namespace", "enabled", "source", "misfire_policy"]
    search_fields = ["name", "task_path"]
    change_form_template = "django_dispatch/admin/cronentry_change_form.html"
    actions = ["enable_entries", "disable_entries", "run_now", "delete_entries"]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None):
        if obj is None:
            return [(None, {"fields": [*DEFINITION, "enabled"]})]
        return [
            (None, {"fields": DEFINITION}),
            ("Preview", {"fields": ["next_fires", "fired_jobs"]}),
            ("Schedule", {"fields": SCHEDULE_STATE}),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None):
        if obj is None:
            return []
        return [*SCHEDULE_STATE_FIELDS, "next_fires", "fired_jobs"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Save the definition; a new schedule or time zone gets its next run recomputed.

        Same rule as the settings sync (``store.cron_sync_from_settings``):
        the watermark stays, ``next_run_at`` is cleared so the scheduler
        recomputes it at its next tick instead of waiting for the old slot.
        """
        if not change:
            super().save_model(request, obj, form, change)
            return
        fields = [f for f in form.changed_data if f in DEFINITION_FIELDS]
        if {"schedule", "timezone"} & set(fields):
            # A new schedule starts afresh from now (as the settings sync does).
            obj.next_run_at = obj.last_slot = None
            fields += ["next_run_at", "last_slot"]
        # Only what the form changed: the scheduler's watermark (last_slot,
        # last_run_at, next_run_at) may have moved since the page was loaded,
        # and writing the stale values back would make a slot fire again.
        if fields:
            obj.save(update_fields=[*fields, "updated_at"])

    @admin.display(description="Jobs fired")
    def fired_jobs(self, entry: CronEntry) -> str:
        """The jobs list narrowed to this entry's slots (their idempotency key ``cron:<name>:``)."""
        query = urlencode(
            {
                "idempotency_key__startswith": f"cron:{entry.name}:",
                "namespace__exact": entry.namespace,
            }
        )
        url = reverse("admin:django_dispatch_job_changelist")
        return format_html('<a href="{}?{}">jobs fired</a>', url, query)

    @admin.display(description=f"Next {PREVIEW_COUNT} fire times")
    def next_fires(self, entry: CronEntry) -> str:
        try:
            times = upcoming(entry, timezone.now())
        except cron.CronError as e:
            return f"Cannot compute the next fire times: {e}"
        zone = ZoneInfo(entry.timezone)
        items = format_html_join(
            "",
            "<li>{} <span class='quiet'>({} UTC)</span></li>",
            (
                (
                    t.astimezone(zone).strftime("%a %Y-%m-%d %H:%M:%S %Z"),
                    t.strftime("%Y-%m-%d %H:%M:%S"),
                )
                for t in times
            ),
        )
        note = "" if entry.enabled else " Disabled: none of these fire until it is enabled."
        return format_html(
            "<ul class='dispatch-fire-times'>{}</ul><p class='help'>In {}, from now.{}</p>",
            items,
            entry.timezone,
            note,
        )

    # --- actions ----------------------------------------------------------------------

    @admin_action(description="Enable selected cron entries", permissions=["change"], location=BOTH)
    def enable_entries(self, request: HttpRequest, queryset: Any) -> None:
        ids = list(selected_ids(queryset))
        changed = services.set_cron_enabled(ids, True)
        record(
            request, CronEntry, ((i, f"cron entry #{i}") for i in ids), "Enabled (admin action)."
        )
        self.message_user(
            request, f"{changed} enabled (they fire from their next slot).", messages.SUCCESS
        )

    @admin_action(
        description="Disable selected cron entries", permissions=["change"], location=BOTH
    )
    def disable_entries(self, request: HttpRequest, queryset: Any) -> None:
        ids = list(selected_ids(queryset))
        changed = services.set_cron_enabled(ids, False)
        record(
            request, CronEntry, ((i, f"cron entry #{i}") for i in ids), "Disabled (admin action)."
        )
        self.message_user(request, f"{changed} disabled.", messages.SUCCESS)

    @admin.action(description="Delete selected cron entries", permissions=["delete"])
    def delete_entries(self, request: HttpRequest, queryset: Any) -> None:
        """Delete; entries still in DISPATCH["CRON"] stay (a worker would recreate them)."""
        ids = list(selected_ids(queryset))
        deleted = services.delete_cron_entries(ids)
        kept = len(ids) - deleted
        if not kept:
            self.message_user(request, f"{deleted} cron entries deleted.", messages.SUCCESS)
            return
        self.message_user(
            request,
            f"{deleted} cron entries deleted; {kept} kept because DISPATCH['CRON'] in the "
            "settings still defines them (remove them there, or disable them here).",
            messages.WARNING,
        )

    @admin_action(
        description="Run selected cron entries now", permissions=["change"], location=BOTH
    )
    def run_now(self, request: HttpRequest, queryset: Any) -> None:
        """One job per entry, now; the schedule (next run, watermark) is untouched."""
        jobs: list[int] = []
        failed: list[str] = []
        for entry_id in selected_ids(queryset):
            try:
                result = services.run_cron_entry_now(entry_id)
            except Exception as e:  # the task moved away, bad arguments, …
                logger.warning("admin: cron entry %s could not run", entry_id, exc_info=True)
                failed.append(f"#{entry_id}: {type(e).__name__}: {e}")
            else:
                jobs.append(int(result.id))
                # "Last run" is what the operator looks at to see it ran; the
                # schedule itself (last_slot, next_run_at) stays the scheduler's.
                CronEntry.objects.using(db_alias()).filter(pk=entry_id).update(last_run_at=Now())
                record(
                    request,
                    CronEntry,
                    [(entry_id, f"cron entry #{entry_id}")],
                    f"Run now: enqueued job #{result.id} (admin action).",
                )
        if jobs:
            links = format_html_join(", ", "{}", ((link(Job, j),) for j in jobs))
            self.message_user(
                request, format_html("{} enqueued: job {}.", len(jobs), links), messages.SUCCESS
            )
        if failed:
            self.message_user(
                request, f"{len(failed)} failed ({'; '.join(failed)}).", messages.ERROR
            )
