"""The workers admin: who is running, where, since when, last seen when.

Read-only: worker rows are written by the workers themselves (register,
heartbeat, deregister) and removed by the leader once stale.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from ..models import Worker
from .aliases import AliasSelector, on_selected_alias
from .common import ReadOnlyRows
from .display import age_html


@admin.register(Worker)
class WorkerAdmin(AliasSelector, ReadOnlyRows, admin.ModelAdmin):
    list_display = [
        "id",
        "namespace",
        "hostname",
        "pid",
        "queues_display",
        "concurrency",
        "capacity",  # what it offers jobs with resource needs
        "locality",
        "running_jobs",
        "started_at",
        "last_seen_age",
        "jobs_link",
    ]
    list_filter = ["namespace"]
    search_fields = ["id", "hostname"]
    actions = None

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="Last heartbeat", ordering="last_seen_at")
    def last_seen_age(self, worker: Worker) -> str:
        return age_html(worker.last_seen_at)

    @admin.display(description="Jobs")
    def jobs_link(self, worker: Worker) -> str:
        """Its running jobs (and, from there, every job it ran: drop the state filter)."""
        url = reverse("admin:django_dispatch_job_changelist")
        query = urlencode({"worker_id__exact": worker.pk, "state__exact": "running"})
        return format_html('<a href="{}">running jobs</a>', on_selected_alias(f"{url}?{query}"))

    @admin.display(description="Queues")
    def queues_display(self, worker: Worker) -> str:
        return ", ".join(worker.queues) or "all"
