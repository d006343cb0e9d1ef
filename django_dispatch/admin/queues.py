"""The admin's queue page: every queue's state and backlog, with pause/resume buttons.

It lives at the ``PausedQueue`` changelist URL
(``/admin/django_dispatch/pausedqueue/``, titled "Queues") and shows
``flow.queue_overview()``, the read function the console and
``dispatch_queue list`` share; below the queues, the concurrency/rate groups
whose excess jobs wait at their cap (``flow.groups_at_cap()``): running
against the cap, starts in the current window, jobs set aside. Pausing and resuming go through
``flow.pause_queue``/``resume_queue`` (never a row edited here), need the
``django_dispatch.pause_queue`` permission, and are POSTs under the admin's
CSRF protection; a user without the permission sees no buttons and is refused
if they post anyway.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from .. import flow
from ..models import PausedQueue
from .aliases import AliasSelector, selected_alias
from .common import has_perm
from .history import record


@admin.register(PausedQueue)
class QueueAdmin(AliasSelector, admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or self.may_pause(request)

    def may_pause(self, request: HttpRequest) -> bool:
        return has_perm(request, "pause_queue")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._act(request)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Queues",
            "queues": flow.queue_overview(backend=selected_alias(request)),
            "groups": flow.groups_at_cap(backend=selected_alias(request)),
            "may_pause": self.may_pause(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "django_dispatch/admin/queues.html", context)

    def _act(self, request: HttpRequest) -> HttpResponse:
        if not self.may_pause(request):
            raise PermissionDenied
        action, name = request.POST.get("action"), request.POST.get("queue", "")
        if action not in ("pause", "resume"):
            self.message_user(request, f"Unknown action {action!r}.", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        try:
            act = flow.pause_queue if action == "pause" else flow.resume_queue
            changed = act(name, backend=selected_alias(request))
        except ValueError as e:
            self.message_user(request, str(e), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        if changed:
            message = f"{action.capitalize()}d queue {name!r} (Queues page)."  # #19: history
            record(request, PausedQueue, [(name, f"queue {name}")], message)
            done = "paused: no new job of it starts" if action == "pause" else "resumed"
            self.message_user(request, f"Queue {name!r} {done}.", messages.SUCCESS)
        else:
            state = "already paused" if action == "pause" else "not paused"
            self.message_user(request, f"Queue {name!r} was {state}.", messages.WARNING)
        return HttpResponseRedirect(request.get_full_path())
