"""Usage in the admin: records, a per-task summary, and a job's own lines.

``JobUsageAdmin`` lists records (read-only: the worker and the reclaim write
them) and serves the summary page (``summary/``: per-task percentiles over a
window, each task read through ``dispatch_usage_task``, at most
``SUMMARY_TASKS`` tasks). ``usage_field`` is the block the job page shows:
what the job needs, where it prefers to run, a warning when no live worker
could ever hold it, and one line per attempt.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from .. import usage
from ..conf import get_settings
from ..core.resources import fits, key_of
from ..core.states import QUEUED_STATES
from ..models import Job, JobUsage, Worker
from ..store import read_database_for
from .aliases import AliasSelector
from .common import ReadOnlyRows

#: Most tasks on the summary page (the busiest first).
SUMMARY_TASKS = 100
#: Attempts shown on a job's page (the newest).
JOB_LINES = 50
WINDOWS = [("hour", 1), ("day", 24), ("week", 24 * 7)]


@admin.register(JobUsage)
class JobUsageAdmin(AliasSelector, ReadOnlyRows, admin.ModelAdmin):
    list_display = [
        "finished_at",
        "job_id",
        "task_path",
        "attempt",
        "outcome",
        "wall_seconds",
        "cpu_seconds",
        "peak_rss_mb",
        "resources",
        "worker_id",
        "host",
        "namespace",
    ]
    list_filter = ["outcome", "namespace"]
    search_fields = ["=task_path"]
    show_full_result_count = False
    actions = None

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        summary = self.admin_site.admin_view(self.summary_view)
        return [
            path("summary/", summary, name="django_dispatch_jobusage_summary"),
            *super().get_urls(),
        ]

    def summary_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            hours = int(request.GET.get("hours", 24))
        except ValueError:
            hours = 24
        since = timezone.now() - timedelta(hours=hours)
        tasks = (
            JobUsage.objects.using(read_database_for(None, JobUsage))
            .filter(finished_at__gte=since)
            .values_list("task_path", flat=True)
            .distinct()
            .order_by("task_path")[:SUMMARY_TASKS]
        )
        rows = [(task, usage.summary(task, since=since)) for task in tasks]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Usage per task",
            "rows": rows,
            "window": hours,
            "windows": WINDOWS,
        }
        return TemplateResponse(request, "django_dispatch/admin/usage_summary.html", context)


def usage_field() -> Any:
    """The job page's "Resources and usage" block: ``usage_display = usage_field()``."""

    @admin.display(description="Resources and usage")
    def display(model_admin: Any, job: Model) -> str:
        return usage_block(job)  # type: ignore[arg-type]

    return display


def usage_block(job: Job) -> str:
    needs = (
        format_html("needs <code>{}</code>", key_of(job.resources))
        if job.resources
        else "no resource needs"
    )
    where = format_html(", prefers locality <code>{}</code>", job.locality) if job.locality else ""
    warning = ""
    if job.resources and job.state in QUEUED_STATES and not _live_worker_fits(job):
        warning = format_html(
            ' <strong class="errornote">No live worker has the capacity for this job: '
            "start one with rundispatch --capacity {}.</strong>",
            ",".join(f"{k}={v}" for k, v in sorted(job.resources.items())),
        )
    rows = (
        JobUsage.objects.using(read_database_for(None, JobUsage))
        .filter(job_id=job.pk)
        .order_by("-attempt", "-id")[:JOB_LINES]
    )
    lines = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                r.attempt,
                r.outcome,
                _num(r.wall_seconds, 3),
                _num(r.cpu_seconds, 3),
                _num(r.peak_rss_mb, 0),
                r.worker_id,
                r.finished_at.strftime("%Y-%m-%d %H:%M:%S"),
            )
            for r in rows
        ),
    )
    table = (
        format_html(
            "<table><thead><tr><th>Attempt</th><th>Outcome</th><th>Wall s</th><th>CPU s</th>"
            "<th>Peak RSS MiB</th><th>Worker</th><th>Finished</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            lines,
        )
        if rows
        else "No attempt recorded yet."
    )
    return format_html("<p>{}{}{}</p>{}", needs, where, warning, table)


def _num(value: float | None, places: int) -> str:
    return "-" if value is None else f"{value:.{places}f}"


def _live_worker_fits(job: Job) -> bool:
    seen = timezone.now() - timedelta(seconds=get_settings().LEASE_SECONDS)
    workers = Worker.objects.using(read_database_for(None, Worker))
    capacities = workers.filter(namespace=job.namespace, last_seen_at__gte=seen).values_list(
        "capacity", flat=True
    )
    return any(fits(job.resources, capacity or {}) for capacity in capacities)
