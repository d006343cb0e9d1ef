"""The events admin: published events (filter by name, key, acked), and a
"Publish an event" page for operators who resolve a stuck wait by hand.

Rows are read-only: only ``events.publish`` / ``events.ack`` write them. The
publish page needs the ``django_dispatch.publish_event`` permission, on GET
and POST alike (a forged POST changes nothing), and goes through
``events.publish``: the same checks, and the same wake-up of waiting
workflow steps, as a publish from code.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from .. import events
from ..models import Event
from ..store import db_alias
from ..tasks.registry import dispatch_aliases
from .aliases import AliasSelector
from .common import BigTable, ReadOnlyRows, RecentValuesFilter, has_perm, rendered_field
from .history import record_one


class AckedFilter(admin.SimpleListFilter):
    title = "acked"
    parameter_name = "acked"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Acked"), ("no", "Not acked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Event]) -> QuerySet[Event]:
        if self.value() == "yes":
            return queryset.filter(acked_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(acked_at__isnull=True)
        return queryset


class PublishForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="The event's name, as steps wait for it.")
    key = forms.CharField(
        max_length=255, required=False, help_text="Empty: no key (wakes waits with no key only)."
    )
    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8, "cols": 60}),
        required=False,
        initial="null",
        help_text='JSON, e.g. {"amount": 42}.',
    )
    backend = forms.ChoiceField(label="Backend (namespace)")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["backend"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(alias, alias) for alias in dispatch_aliases()]

    def clean_payload(self) -> Any:
        text = self.cleaned_data["payload"].strip() or "null"
        try:
            return json.loads(text)
        except ValueError as e:
            raise forms.ValidationError(f"Not JSON: {e}.") from None


@admin.register(Event)
class EventAdmin(AliasSelector, ReadOnlyRows, BigTable):
    list_display = [
        "id",
        "namespace",
        "name",
        "key",
        "published_at",
        "acked_at",
        "deliveries",
        "lease_expires_at",
    ]
    list_filter = [
        AckedFilter,
        ("name", RecentValuesFilter),
        ("namespace", RecentValuesFilter),
        "published_at",
    ]
    search_fields = ["=key", "=name", "=id"]
    search_help_text = "Event id, name or key (exact)."
    fields = [
        ("id", "namespace", "name", "key"),
        ("published_at", "acked_at", "deliveries", "lease_expires_at"),
        "payload_display",
    ]
    readonly_fields = ["payload_display"]
    payload_display = rendered_field("payload", "Payload")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def may_publish(self, request: HttpRequest) -> bool:
        return has_perm(request, "publish_event")

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.publish_view)
        name = f"{self.opts.app_label}_{self.opts.model_name}_publish"
        return [path("publish/", view, name=name), *super().get_urls()]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = dict(extra_context or {})
        if self.may_publish(request):
            url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_publish")
            extra["subtitle"] = format_html(
                '<a class="button" href="{}">Publish an event…</a>', url
            )
        return super().changelist_view(request, extra)

    def publish_view(self, request: HttpRequest) -> HttpResponse:
        if not self.may_publish(request):
            raise PermissionDenied
        form = PublishForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                event_id = events.publish(
                    data["name"], data["payload"], key=data["key"] or None, backend=data["backend"]
                )
            except (TypeError, ValueError) as e:
                form.add_error(None, str(e))
            else:
                event = Event.objects.using(db_alias()).get(pk=event_id)
                record_one(request, event, "Published (admin form).")
                self.message_user(
                    request, f"Event #{event_id} {data['name']!r} published.", messages.SUCCESS
                )
                return HttpResponseRedirect(
                    reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
                )
        context = {
            **self.admin_site.each_context(request),
            "title": "Publish an event",
            "opts": self.opts,
            "form": form,
            "has_view_permission": self.has_view_permission(request),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "django_dispatch/admin/event_publish.html", context)
