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
from django.db.models import Q, TextField
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.text import smart_split, unescape_string_literal

from .. import services
from ..compat import admin_action
from ..exceptions import AlreadyReplayed
from ..models import DeadLetter, Job
from ..store import read_database_for
from .aliases import AliasSelector
from .bulk import BulkRetryPage
from .common import (
    BOTH,
    BigTable,
    DeleteThroughAction,
    NamespaceColumn,
    ReadOnlyRows,
    RecentValuesFilter,
    ReplayPage,
    SQLiteWriteLockFirst,
    change_url,
    id_list,
    link,
    pretty_json,
    render_errors,
    rendered_field,
    selected_ids,
    username,
)
from .display import age_html, short_text
from .forms import ReplayForm
from .history import record

logger = logging.getLogger("django_dispatch.admin")


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
    """Replay one entry as the current user, in its history; exceptions are the caller's."""
    result = services.replay(dead_letter_id, replayed_by=username(request), **corrections)
    how = " with corrected arguments" if corrections else ""
    record(
        request,
        DeadLetter,
        [(dead_letter_id, f"dead letter #{dead_letter_id}")],
        f"Replayed{how} as job #{result.id} (admin action).",
    )
    return result


@admin.register(DeadLetter)
class DeadLetterAdmin(
    AliasSelector,
    NamespaceColumn,
    BulkRetryPage,
    SQLiteWriteLockFirst,
    ReadOnlyRows,
    DeleteThroughAction,
    BigTable,
    ReplayPage,
):
    # Fits 1280 px with the sidebar open (partition key: the entry's page;
    # the namespace column only with several namespaces, ``NamespaceColumn``).
    list_display = [
        "id",
        "namespace",
        "task_path",
        "error_class",
        "short_error_message",
        "failed_age",
        "replayed",
        "replay_job",
    ]
    #: The fields each column reads (``paging.listed_fields``); "": ``__str__``.
    list_reads = {
        "": ("task_path", "job_id", "error_class"),
        "short_error_message": ("error_message",),
        "failed_age": ("failed_at",),
        "replayed": ("replayed_at",),
        "replay_job": ("replay_job_id",),
    }
    bulk_action = "replay_entries"
    bulk_permission = "replay"
    bulk_label = "Replay all matching…"
    bulk_verb = "replay"
    list_filter = [
        ("namespace", RecentValuesFilter),
        ("task_path", RecentValuesFilter),
        ("error_class", RecentValuesFilter),
        ReplayedFilter,
        "failed_at",
    ]
    search_fields = ["task_path", "error_message", "partition_key", "args"]
    search_help_text = "Task path, error message, partition key, or text in the arguments."
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
                    "namespace",
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
        ("Arguments", {"fields": ["args_display", "kwargs_display", "call_context_display"]}),
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
        "call_context_display",
        "errors_display",
        "worker_ids_display",
        "replay_args_display",
        "replay_kwargs_display",
        "replay_job",
    ]

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

    def bulk_actionable(self, queryset: Any) -> Any:
        return queryset.filter(replayed_at__isnull=True)

    @admin.display(description="Failed", ordering="failed_at")
    def failed_age(self, letter: DeadLetter) -> str:
        return age_html(letter.failed_at)

    @admin.display(description="Error message")
    def short_error_message(self, letter: DeadLetter) -> str:
        return short_text(letter.error_message, 80)

    @admin.display(description="Replayed", boolean=True, ordering="replayed_at")
    def replayed(self, letter: DeadLetter) -> bool:
        return letter.replayed_at is not None

    @admin.display(description="Replay job", ordering="replay_job_id")
    def replay_job(self, letter: DeadLetter) -> str:
        return link(Job, letter.replay_job_id)

    @admin.display(description="Failed job")
    def job_link(self, letter: DeadLetter) -> str:
        if letter.job_id is None:
            return "-"
        if not Job.objects.using(read_database_for(None, Job)).filter(pk=letter.job_id).exists():
            return f"#{letter.job_id} (deleted by retention)"
        return link(Job, letter.job_id)

    args_display = rendered_field("args", "Args")
    kwargs_display = rendered_field("kwargs", "Kwargs")
    call_context_display = rendered_field("call_context", "Call context (kept by a replay)")
    errors_display = rendered_field("errors", "Errors (one per failed attempt)", render_errors)
    worker_ids_display = rendered_field("worker_ids", "Worker ids")

    @admin.display(description="Replay args")
    def replay_args_display(self, letter: DeadLetter) -> str:
        return "-" if letter.replayed_at is None else pretty_json(letter.replay_args)

    @admin.display(description="Replay kwargs")
    def replay_kwargs_display(self, letter: DeadLetter) -> str:
        return "-" if letter.replayed_at is None else pretty_json(letter.replay_kwargs)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["can_replay"] = self.has_replay_permission(request)
        if obj is not None:
            context["replay_url"] = self.replay_url(obj.pk)
        return super().render_change_form(request, context, add, change, form_url, obj)

    # --- actions --------------------------------------------------------------------

    @admin_action(description="Replay selected dead letters", permissions=["replay"], location=BOTH)
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

    # --- "Replay with corrected arguments" (the page: ``ReplayPage``) -----------------

    def replay_missing(self, request: HttpRequest, object_id: str) -> HttpResponse:
        self.message_user(
            request, f"Dead letter {object_id} does not exist (deleted?).", messages.WARNING
        )
        return HttpResponseRedirect(reverse("admin:django_dispatch_deadletter_changelist"))

    def replay_page(self, request: HttpRequest, letter: DeadLetter) -> HttpResponse:
        """One entry, replayed with arguments the operator corrected (validated JSON)."""
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
        return self.render_replay_page(
            request,
            letter,
            form,
            f"Replay dead letter #{letter.pk} with corrected arguments",
            errors_html=render_errors(letter.errors[-1:], first=max(len(letter.errors), 1)),
        )
