"""The operations overview: queues, throughput, latency, workers, dead letters, cron.

Served at ``admin/django_dispatch/job/overview/`` (linked from the app's
admin index and the jobs list) by ``JobAdmin``, because seeing it needs what
seeing jobs needs: the ``view_job`` permission. It only reads (``queries.console``
does the bounded queries); the controls it shows (pause/resume) post to
their own views, which check their own permissions.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.admin.models import ADDITION, DELETION
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from .. import flow
from ..models import Job, PausedQueue
from ..queries import console
from ..tasks.registry import backend_for
from .common import has_perm
from .history import record

TEMPLATE = "admin/django_dispatch/overview.html"


class OverviewPage:
    """Adds the overview's URL (``admin:django_dispatch_job_overview``) to the jobs admin."""

    admin_site: Any
    opts: Any

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.overview_view)
        pause = self.admin_site.admin_view(require_POST(self.pause_view))
        return [
            path("overview/", view, name="django_dispatch_job_overview"),
            path("overview/pause/", pause, name="django_dispatch_job_overview_pause"),
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
            "can_pause": data.pause_supported and can_pause(request),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, TEMPLATE, context)

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """Pause or resume one queue (POST, CSRF-checked by ``admin_view``), then back.

        Needs ``pause_queue`` (as the Queues page does), checked here whatever
        the page showed. Goes through ``flow.pause_queue``/``resume_queue`` under
        the TASKS alias of the namespace shown, so their validation applies.
        """
        if not (self.has_view_permission(request) and can_pause(request)):  # type: ignore[attr-defined]
            raise PermissionDenied
        queue = request.POST.get("queue", "")
        namespace = request.POST.get("namespace", "")
        op = request.POST.get("op")
        back = reverse("admin:django_dispatch_job_overview")
        if namespace:
            back += "?" + urlencode({"namespace": namespace})
        alias = alias_of(namespace)
        if op not in ("pause", "resume") or alias is None:
            what = (
                f"unknown operation {op!r}"
                if alias
                else f"no TASKS alias for namespace {namespace!r}"
            )
            messages.error(request, f"Nothing changed: {what}.")
            return HttpResponseRedirect(back)
        try:
            changed = (flow.pause_queue if op == "pause" else flow.resume_queue)(
                queue, backend=alias
            )
        except ValueError as e:
            messages.error(request, f"Nothing changed: {e}")
            return HttpResponseRedirect(back)
        done = "paused" if op == "pause" else "resumed"
        if changed:
            record(
                request,
                PausedQueue,
                [(f"{namespace}/{queue}", f"queue {queue}")],
                f"{done.capitalize()} queue {queue!r} (namespace {namespace!r}) from the overview.",
                flag=ADDITION if op == "pause" else DELETION,
            )
            messages.success(request, f"Queue {queue!r} {done}.")
        else:
            messages.warning(request, f"Queue {queue!r} was already {done}: nothing changed.")
        return HttpResponseRedirect(back)


def can_pause(request: HttpRequest) -> bool:
    """The flow-control permission ``pause_queue``, also used by the Queues page."""
    return has_perm(request, "pause_queue")


def alias_of(namespace: str) -> str | None:
    """The TASKS alias whose DispatchBackend serves ``namespace`` (first one), or None."""
    for alias in getattr(settings, "TASKS", {}):
        backend = backend_for(alias)
        if backend is not None and backend.namespace == namespace:
            return alias
    return None
