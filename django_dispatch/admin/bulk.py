""" "Retry / replay all that match this filter", bounded and confirmed.

After an incident is fixed, the operator wants every failed job of the
faulty task re-run, not to tick them page by page. The list's own filters
and search pick the rows; a confirmation page says how many the action will
touch (at most ``BULK_CAP``, the oldest first: run it again for more) before
anything is done. The count is of rows the action can act on (failed jobs
or retries waiting; dead letters not yet replayed), so the number shown is
the number that will be retried. The work itself is the model's own action
(``retry_jobs``, ``replay_entries``) on that bounded selection, with its
usual permission check, messages and history entries.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from ..core.states import QUEUED_STATES, JobState

#: Rows one confirmation acts on, at most.
BULK_CAP = 1000
TEMPLATE = "django_dispatch/admin/bulk_confirm.html"


class BulkRetryPage:
    """Adds ``<model>/bulk/`` and a link to it on the list, for users allowed to act."""

    #: The model admin's action doing the work, and its permission name.
    bulk_action = "retry_jobs"
    bulk_permission = "retry"
    bulk_label = "Retry / replay all matching…"
    bulk_verb = "retry or replay"

    admin_site: Any
    opts: Any
    model: Any

    def bulk_actionable(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The rows of ``queryset`` the action can act on."""
        return queryset.filter(state=JobState.FAILED) | queryset.filter(
            state__in=QUEUED_STATES, attempts__gt=0
        )

    def has_bulk_permission(self, request: HttpRequest) -> bool:
        check = getattr(self, f"has_{self.bulk_permission}_permission")
        return bool(self.has_view_permission(request) and check(request))  # type: ignore[attr-defined]

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_bulk"
        view = self.admin_site.admin_view(self.bulk_view)
        return [path("bulk/", view, name=name), *super().get_urls()]  # type: ignore[misc]

    def bulk_url(self, request: HttpRequest) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_bulk")
        query = request.GET.urlencode()
        return f"{url}?{query}" if query else url

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        extra = dict(extra_context or {})
        if self.has_bulk_permission(request):
            extra.update(bulk_url=self.bulk_url(request), bulk_label=self.bulk_label)
        return super().changelist_view(request, extra)  # type: ignore[misc]

    def bulk_selection(self, request: HttpRequest) -> tuple[QuerySet[Any], int]:
        """The first ``BULK_CAP`` actionable rows matching the list's filters, and their count."""
        changelist = self.get_changelist_instance(request)  # type: ignore[attr-defined]
        matching = self.bulk_actionable(changelist.get_queryset(request))
        ids = list(matching.order_by("pk").values_list("pk", flat=True)[: BULK_CAP + 1])
        more = len(ids) > BULK_CAP
        ids = ids[:BULK_CAP]
        # On the list's database (``?alias=``): the same ids on another database are other rows.
        return matching.model._default_manager.using(matching.db).filter(pk__in=ids), len(ids) + (
            1 if more else 0
        )

    def bulk_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_bulk_permission(request):
            raise PermissionDenied
        selection, count = self.bulk_selection(request)
        changelist_url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
        query = request.GET.urlencode()
        back = f"{changelist_url}?{query}" if query else changelist_url
        if request.method == "POST":
            getattr(self, self.bulk_action)(request, selection)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{self.bulk_label.rstrip('…')}?",
            "subtitle": None,
            "opts": self.opts,
            "count": min(count, BULK_CAP),
            "more": count > BULK_CAP,
            "cap": BULK_CAP,
            "verb": self.bulk_verb,
            "back": back,
            "filters": query,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, TEMPLATE, context)
