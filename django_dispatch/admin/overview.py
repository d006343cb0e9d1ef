"""The operations overview: queues, throughput, latency, workers, dead letters, cron.

Served at ``admin/django_dispatch/job/overview/`` (linked from the app's
admin index and the jobs list) by ``JobAdmin``, because seeing it needs what
seeing jobs needs: the ``view_job`` permission. It only reads (``console``
does the bounded queries); the controls it shows (pause/resume) post to
their own views, which check their own permissions.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from .. import console
from ..models import Job

TEMPLATE = "admin/django_dispatch/overview.html"


class OverviewPage:
    """Adds the overview's URL (``admin:django_dispatch_job_overview``) to the jobs admin."""

    admin_site: Any
    opts: Any

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.overview_view)
        return [
            path("overview/", view, name="django_dispatch_job_overview"),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        namespace = request.GET.get("namespace", "")
        data = console.overview(namespace)
        context = {
            **self.admin_site.each_context(request),
            "title": "Operations overview",
            "subtitle": None,
            "opts": Job._meta,
            "overview": data,
            "totals": data.totals,
            "can_pause": data.pause_supported
            and request.user.has_perm("django_dispatch.pause_queue"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, TEMPLATE, context)
