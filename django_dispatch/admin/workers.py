"""The workers admin: who is running, where, since when, last seen when.

Read-only: worker rows are written by the workers themselves (register,
heartbeat, deregister) and removed by the leader once stale.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from ..models import Worker
from .common import ReadOnlyRows


@admin.register(Worker)
class WorkerAdmin(ReadOnlyRows, admin.ModelAdmin):
    list_display = [
        "id",
        "namespace",
        "hostname",
        "pid",
        "queues_display",
        "concurrency",
        "running_jobs",
        "started_at",
        "last_seen_at",
    ]
    list_filter = ["namespace"]
    search_fields = ["id", "hostname"]
    actions = None

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="Queues")
    def queues_display(self, worker: Worker) -> str:
        return ", ".join(worker.queues) or "all"
