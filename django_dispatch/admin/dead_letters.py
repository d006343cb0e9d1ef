"""The dead letters admin: inspect failures, replay them (as is or corrected), delete.

A replay is one compare-and-set in ``services.replay``; this admin only
reports its outcome. Each selected entry is replayed on its own, so one
entry that cannot be replayed (already replayed by someone else, arguments
the task no longer accepts, a task that was removed) never stops the others,
and is listed in the message instead of raising a 500.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, TextField
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator, smart_split, unescape_string_literal

from .. import services
from ..exceptions import AlreadyReplayed
from ..models import DeadLetter, Job
from .common import (
    CHANGE_LIST_TEMPLATE,
    CappedPaginator,
    DeleteThroughAction,
    ReadOnlyRows,
    RecentValuesFilter,
    SQLiteWriteLockFirst,
    change_url,
    has_perm,
    id_list,
    pretty_json,
    render_errors,
    selected_ids,
    username,
)
from .forms import ReplayForm

logger = logging.getLogger("django_dispatch.admin")

BOTH = [admin.ActionLocation.CHANGE_LIST, admin.ActionLocation.CHANGE_FORM]


class ReplayedFilter(admin.SimpleListFilter):
    title = "replayed"
    parameter_name = "replayed"

    def lookups(self, request, model_admin):
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(replayed_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(replayed_at__isnull=True)
        return queryset


def replay_one(request: HttpRequest, dead_letter_id: int, **corrections: Any) -> Any:
    """Replay one entry as the current user; exceptions are the caller's to report."""
    return services.replay(dead_letter_id, replayed_by=username(request), **corrections)


@admin.register(DeadLetter)
class DeadLetterAdmin(SQLiteWriteLockFirst, ReadOnlyRows, DeleteThroughAction, admin.ModelAdmin):
    list_display = [
        "id",
        "task_path",
        "error_class",
        "short_error_message",
        "failed_at",
        "replayed",
        "replay_job",
        "partition_key",
    ]
    list_filter = [
        ("task_path", RecentValuesFilter),
        ("error_class", RecentValuesFilter),
        ReplayedFilter,
        "failed_at",
    ]
    search_fields = ["task_path", "error_message", "partition_key", "args"]
    search_help_text = "Task path, error message, partition key, or text in the arguments."
    list_per_page = 100
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    change_list_template = CHANGE_LIST_TEMPLATE
    change_form_template = "django_dispatch/admin/deadletter_change_form.html"
    actions = ["replay_entries", "delete_entries"]

    fieldsets = [
        (
            None,
            {
                "fields": [
                    "id",
                    "job_link",
                    "task_path",
                    "backend",
                    "queue_name",
                    "priority",
                    "partition_key",
                    "enqueued_at",
                    "failed_at",
                    "error_class",
                    "error_message",
                ]
            },
        ),
        ("Arguments", {"fields": ["args_display", "kwargs_display"]}),
        ("Errors", {"fields": ["errors_display", "worker_ids_display"]}),
        (
            "Replay history",
            {
                "fields": [
                    "replayed_at",
                    "replayed_by",
                    "replay_args_display",
                    "replay_kwargs_display",
                    "replay_job",
                ]
            },
        ),
    ]
    readonly_fields = [
        "job_link",
        "args_display",
        "kwargs_display",
        "errors_display",
        "worker_ids_display",
        "replay_args_display",
        "replay_kwargs_display",
        "replay_job",
    ]

    # --- permissions ------------------------------------------------------------

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "replay_deadletter")

    # --- search: the arguments are JSON, searched as their text -------------------

    def get_search_results(
        self, request: HttpRequest, queryset: Any, search_term: str
    ) -> tuple[Any, bool]:
        """Every word must appear in one of the text fields or the arguments' JSON.

        ``args__icontains`` means different things on PostgreSQL (jsonb
        containment) and SQLite, so the JSON is cast to text first: on both
        it then matches what the detail page shows.
        """
        if not search_term:
            return queryset, False
        queryset = queryset.annotate(_args_text=Cast("args", TextField()))
        for bit in smart_split(search_term):
            if bit.startswith(('"', "'")) and bit[0] == bit[-1]:
                bit = unescape_string_literal(bit)
            queryset = queryset.filter(
                Q(task_path__icontains=bit)
                | Q(error_message__icontains=bit)
                | Q(partition_key__icontains=bit)
                | Q(_args_text__icontains=bit)
            )
        return queryset, False

    # --- list and detail ----------------------------------------------------------

    @admin.display(description="Error message")
    def short_error_message(self, letter: DeadLetter) -> str:
        return Truncator(letter.error_message).chars(80)

    @admin.display(description="Replayed", boolean=True, ordering="replayed_at")
    def replayed(self, letter: DeadLetter) -> bool:
        return letter.replayed_at is not None

    @admin.display(description="Replay job", ordering="replay_job_id")
    def replay_job(self, letter: DeadLetter) -> str:
        if letter.replay_job_id is None:
            return "-"
        return format_html(
            '<a href="{}">#{}</a>', change_url(Job, letter.replay_job_id), letter.replay_job_id
        )

    @admin.display(description="Failed job")
    def job_link(self, letter: DeadLetter) -> str:
        if letter.job_id is None:
            return "-"
        if not Job.objects.filter(pk=letter.job_id).exists():
            return f"#{letter.job_id} (deleted by retention)"
        return format_html('<a href="{}">#{}</a>', change_url(Job, letter.job_id), letter.job_id)

    @admin.display(description="Args")
    def args_display(self, letter: DeadLetter) -> str:
        return pretty_json(letter.args)

    @admin.display(description="Kwargs")
    def kwargs_display(self, letter: DeadLetter) -> str:
        return pretty_json(letter.kwargs)

    @admin.display(description="Errors (one per failed attempt)")
    def errors_display(self, letter: DeadLetter) -> str:
        return render_errors(letter.errors)

    @admin.display(description="Worker ids")
    def worker_ids_display(self, letter: DeadLetter) -> str:
        return pretty_json(letter.worker_ids)

    @admin.display(description="Replay args")
    def replay_args_display(self, letter: DeadLetter) -> str:
        return "-" if letter.replayed_at is None else pretty_json(letter.replay_args)

    @admin.display(description="Replay kwargs")
    def replay_kwargs_display(self, letter: DeadLetter) -> str:
        return "-" if letter.replayed_at is None else pretty_json(letter.replay_kwargs)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["can_replay"] = self.has_replay_permission(request)
        if obj is not None:
            context["replay_url"] = reverse(
                "admin:django_dispatch_deadletter_replay", args=[obj.pk]
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    # --- actions --------------------------------------------------------------------

    @admin.action(description="Replay selected dead letters", permissions=["replay"], location=BOTH)
    def replay_entries(self, request: HttpRequest, queryset: Any) -> None:
        replayed = 0
        already: list[int] = []
        failed: list[str] = []
        for letter_id in selected_ids(queryset):
            try:
                replay_one(request, letter_id)
            except AlreadyReplayed:
                already.append(letter_id)
            except Exception as e:  # reported to the operator, never a 500
                logger.warning("admin: replay of dead letter %s failed", letter_id, exc_info=True)
                failed.append(f"#{letter_id}: {type(e).__name__}: {e}")
            else:
                replayed += 1
        parts = [f"{replayed} replayed"]
        if already:
            parts.append(f"{len(already)} already replayed ({id_list(already)})")
        if failed:
            parts.append(f"{len(failed)} failed ({'; '.join(failed)})")
        level = messages.SUCCESS
        if already or failed:
            level = messages.WARNING if replayed else messages.ERROR
        self.message_user(request, "; ".join(parts) + ".", level)

    @admin.action(description="Delete selected dead letters", permissions=["delete"])
    def delete_entries(self, request: HttpRequest, queryset: Any) -> None:
        ids = list(selected_ids(queryset))
        deleted = services.delete_dead_letters(ids)
        self.message_user(request, f"{deleted} dead letters deleted.", messages.SUCCESS)

    # --- "Replay with corrected arguments" ---------------------------------------------

    def get_urls(self):
        urls = [
            path(
                "<path:object_id>/replay/",
                self.admin_site.admin_view(self.replay_view),
                name="django_dispatch_deadletter_replay",
            )
        ]
        return urls + super().get_urls()

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """One entry, replayed with arguments the operator corrected (validated JSON)."""
        if not (self.has_view_permission(request) and self.has_replay_permission(request)):
            raise PermissionDenied
        letter = self.get_object(request, object_id)
        if letter is None:
            self.message_user(
                request, f"Dead letter {object_id} does not exist (deleted?).", messages.WARNING
            )
            return HttpResponseRedirect(reverse("admin:django_dispatch_deadletter_changelist"))
        if request.method == "POST":
            form = ReplayForm(request.POST)
            if form.is_valid():
                try:
                    result = replay_one(
                        request,
                        letter.pk,
                        args=form.cleaned_data["args"],
                        kwargs=form.cleaned_data["kwargs"],
                    )
                except AlreadyReplayed as e:
                    form.add_error(None, str(e))
                except Exception as e:  # bad arguments for the task, task gone, …
                    form.add_error(None, f"Not replayed: {type(e).__name__}: {e}")
                else:
                    self.message_user(
                        request,
                        f"Dead letter #{letter.pk} replayed as job #{result.id}.",
                        messages.SUCCESS,
                    )
                    return HttpResponseRedirect(change_url(DeadLetter, letter.pk))
            letter.refresh_from_db()  # a concurrent replay shows in the history
        else:
            form = ReplayForm(initial={"args": letter.args, "kwargs": letter.kwargs})
        context = {
            **self.admin_site.each_context(request),
            "title": f"Replay dead letter #{letter.pk} with corrected arguments",
            "subtitle": None,
            "opts": self.opts,
            "original": letter,
            "form": form,
            "has_view_permission": self.has_view_permission(request, letter),
            "errors_html": render_errors(letter.errors[-1:], first=max(len(letter.errors), 1)),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "django_dispatch/admin/deadletter_replay.html", context)
