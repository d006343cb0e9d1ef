"""Pieces shared by the model admins: bounded lists, readable JSON, links, reports, replays.

The job table can hold millions of finished rows, so nothing here may cost a
scan of it: the paginator counts at most ``COUNT_CAP`` rows, and the value
filters sample recent rows instead of ``SELECT DISTINCT`` over the table.

Workers commit all the time, so nothing here may hold a read open across a
write on SQLite either (see ``SQLiteWriteLockFirst`` and ``selected_rows``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from html import escape
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db import connections, transaction
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

from ..compat import ON_LIST_AND_PAGE
from ..queries.instances import quick
from ..store.base import db_alias, take_sqlite_write_lock
from ..tasks.registry import backend_for
from .aliases import on_selected_alias
from .display import per_page
from .paging import (
    COUNT_CAP,
    FILTER_SAMPLE,
    CappedPaginator,
    RecentValuesFilter,
    list_database,
    listed_fields,
    merged_rows,
    newest_first,
)

__all__ = ["COUNT_CAP", "FILTER_SAMPLE", "CappedPaginator", "RecentValuesFilter", "list_database"]

#: Changelist templates that explain a capped count.
CHANGE_LIST_TEMPLATE = "django_dispatch/admin/change_list.html"
#: The change form with readable JSON and tracebacks.
CHANGE_FORM_TEMPLATE = "django_dispatch/admin/change_form.html"
#: Where an operator action is offered: the changelist and the row's own page.
BOTH = ON_LIST_AND_PAGE
#: Rows an action reads per query (see ``selected_rows``).
SELECTION_BATCH = 1000
#: Request methods that never write (Django's own list in ``changeform_view``).
SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")
#: ``per_page``'s key of the row checkbox's translated label.
CHECKBOX_LABEL = "action_checkbox label"
#: The row checkbox's name, escaped.
CHECKBOX_NAME = escape(helpers.ACTION_CHECKBOX_NAME)


class BigTable(admin.ModelAdmin):
    """A changelist that stays cheap on a table of millions of rows.

    The count stops at a cap (``CappedPaginator``; the template says "more
    than"), the unfiltered total is not counted a second time, and filters
    show no facet counts (one more count per choice).

    A changelist shown (GET) reads from ``DISPATCH["READ_DATABASE"]``'s
    replica when it is healthy (``queries.reading``): paging through the
    history is the admin's heavy reading. Everything else reads the primary
    (``store.base.db_alias()``): the change page, and above all an action's
    POST, whose selection decides what is written and must not miss a row a
    replica has not replayed yet.
    """

    list_per_page = 100
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    change_list_template = CHANGE_LIST_TEMPLATE

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        if request.method in SAFE_METHODS:
            request.dispatch_reads_replica = True  # type: ignore[attr-defined]
        return super().changelist_view(request, extra_context)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows = super().get_queryset(request).using(list_database(request))
        # A change list shown reads only what its columns show (``listed_fields``).
        listing = getattr(request, "dispatch_reads_replica", False)
        fields = listed_fields(self, request) if listing else None
        return rows.only(*fields) if fields else rows

    def list_parts(self, queryset: QuerySet[Any]) -> list[QuerySet[Any]] | None:
        """The change list's rows as parts read apart (``paging``), or None: one query."""
        return None

    def get_paginator(self, request: HttpRequest, queryset: Any, *args: Any, **kwargs: Any) -> Any:
        paginator = super().get_paginator(request, queryset, *args, **kwargs)
        if isinstance(paginator, CappedPaginator) and isinstance(queryset, QuerySet):
            paginator.parts = self.list_parts(queryset) if newest_first(queryset) else None
        return paginator

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The page's rows merged from the parts' newest, when the list has parts."""
        changelist = super().get_changelist_instance(request)
        parts = getattr(changelist.paginator, "parts", None)
        rows = changelist.result_list
        if parts and isinstance(rows, QuerySet) and rows._result_cache is None:
            low, high = rows.query.low_mark, rows.query.high_mark
            high = changelist.result_count if high is None else high
            changelist.result_list = merged_rows(changelist.queryset, parts, low, high)
        elif isinstance(rows, QuerySet) and rows._result_cache is None:
            changelist.result_list = quick(rows)  # the same rows, built faster
        return changelist

    @admin.display(description=mark_safe('<input type="checkbox" id="action-toggle">'))
    def action_checkbox(self, obj: Any) -> SafeString:
        """Django's row checkbox, written out: Django renders a form widget through
        the template engine for each row, a third of a page of 100 rows' time."""
        # What format_safe gives (the label is safe once its object is escaped),
        # without its calls: a page writes 100 of these.
        label = per_page(CHECKBOX_LABEL, lambda: gettext("Select this object for an action - {}"))
        label = label.format(escape(str(obj)))
        pk = obj.pk
        value = str(pk) if type(pk) is int else escape(str(pk))  # digits: nothing to escape
        return SafeString(
            f'<input type="checkbox" name="{CHECKBOX_NAME}" '
            f'value="{value}" class="action-select" aria-label="{label}">'
        )


def configured_namespaces() -> set[str]:
    """The namespaces of the DispatchBackends in ``settings.TASKS`` (no query)."""
    found = set()
    for alias in getattr(settings, "TASKS", {}):
        backend = backend_for(alias)
        if backend is not None:
            found.add(backend.namespace)
    return found


class NamespaceColumn:
    """A ``namespace`` column only where more than one namespace is configured.

    Most sites have one namespace, and a column repeating "" costs the width
    the lists need at 1280 px; a site sharing its database between
    namespaces sees which row is whose.
    """

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = list(super().get_list_display(request))  # type: ignore[misc]
        if len(configured_namespaces()) <= 1 and "namespace" in shown:
            shown.remove("namespace")
        return shown


class ReadOnlyRows:
    """For rows only the store writes (jobs, dead letters, workers): no add or change page."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class DeleteThroughAction:
    """Deleting only through the model's own action, which calls a service.

    Django's per-object delete page and its generic "delete selected" action
    would delete rows directly, bypassing the service's rules (keep live
    jobs, keep cron entries still in settings): both are taken away; the
    delete permission still governs the model's own action.
    """

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_delete_permission(request)  # type: ignore[misc]

    def get_actions(self, request, action_location=None):
        # Django 6.1 passes action_location (and looks for it in this signature);
        # 5.2 and 6.0 have no such parameter.
        kwargs = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **kwargs)  # type: ignore[misc]
        actions.pop("delete_selected", None)
        return actions


class SQLiteWriteLockFirst:
    """A change page's POST starts as SQLite's writer, before its first read.

    Django runs a change page's POST (saving the form, or an action run from
    the page) inside one transaction, ``changeform_view``'s, which reads the
    object first and writes later. SQLite cannot turn a transaction that
    read into a writer once another connection (a worker completing jobs)
    committed in between: it answers "database is locked" at once, without
    waiting out the busy timeout, and the operator's action fails whenever a
    worker is busy. Taking the write lock before that first read makes the
    request wait its turn behind the workers' short transactions instead (up
    to the connection's ``timeout``), then run as the only writer. Nothing
    changes on other databases, nor for pages that only read.

    Under ``ATOMIC_REQUESTS`` the request's transaction has already read (the
    session, the user) before this runs, so it cannot help there: configure
    SQLite with ``"OPTIONS": {"transaction_mode": "IMMEDIATE"}`` then (see
    docs/operating.md).
    """

    model: type[Model]

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        view = super().changeform_view  # type: ignore[misc]
        db = db_alias()
        if request.method in SAFE_METHODS or connections[db].vendor != "sqlite":
            return view(request, object_id, form_url, extra_context)
        with transaction.atomic(using=db):
            take_sqlite_write_lock(db)
            return view(request, object_id, form_url, extra_context)


def selected_rows(queryset: QuerySet[Any], *fields: str) -> Iterator[tuple[Any, ...]]:
    """``(pk, *fields)`` of an action's selection, in pk order, read in batches.

    The selection may be "select all" over millions of rows, so it is not
    loaded at once; nor is it streamed through one open cursor, because on
    SQLite a statement left open keeps its read transaction open, and the
    writes the action makes between two fetches would then fail with
    "database is locked" as soon as a worker commits. Each batch is a
    complete query of its own (keyset pagination on the primary key).
    """
    ordered = queryset.order_by("pk")
    last = None
    while True:
        batch = ordered if last is None else ordered.filter(pk__gt=last)
        rows = list(batch.values_list("pk", *fields)[:SELECTION_BATCH])
        yield from rows
        if len(rows) < SELECTION_BATCH:
            return
        last = rows[-1][0]


def selected_ids(queryset: QuerySet[Any]) -> Iterator[int]:
    """The primary keys of an action's selection (see ``selected_rows``)."""
    return (row[0] for row in selected_rows(queryset))


def pretty_json(value: Any) -> SafeString:
    """JSON indented in a ``<pre>``, so nested arguments and results are readable."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return format_html('<pre class="dispatch-json">{}</pre>', text)


def render_errors(errors: Iterable[dict[str, Any]], *, first: int = 1) -> SafeString:
    """Each attempt's error: exception class, message, and its traceback verbatim.

    ``first`` is the attempt number of the first error given (to show only
    the last ones of a long history with their real numbers).
    """
    rendered = format_html_join(
        "",
        '<div class="dispatch-error"><p><strong>Attempt {}: {}</strong>{}{}</p>'
        '<pre class="dispatch-traceback">{}</pre></div>',
        (
            (
                number,
                error.get("exception_class_path", "?"),
                _code_html(error),
                format_html(" — {}", error["message"]) if error.get("message") else "",
                error.get("traceback", "").rstrip() or "(no traceback)",
            )
            for number, error in enumerate(errors, start=first)
        ),
    )
    return rendered or format_html("<p>{}</p>", "No errors.")


def _code_html(error: dict[str, Any]) -> str:
    """The failure's code when it says more than its class (``core.failures.error_code``)."""
    code = error.get("code")
    if not code or code == error.get("exception_class_path"):
        return ""
    return format_html(' <code class="dispatch-error-code">[{}]</code>', code)


def change_url(model: type[Model], pk: Any) -> str:
    """The change page of ``model``'s row ``pk``, on the alias the request picked."""
    opts = model._meta
    return on_selected_alias(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[pk]))


def link(model: type[Model], pk: Any, label: str | None = None) -> str:
    """``label`` (``#pk`` by default) linking to the row's change page; "-" for no row."""
    if pk is None:
        return "-"
    return format_html(
        '<a href="{}">{}</a>', change_url(model, pk), f"#{pk}" if label is None else label
    )


def rendered_field(
    field: str, description: str, render: Callable[[Any], str] = pretty_json
) -> Callable[[Any, Model], str]:
    """A read-only field of a change page showing ``render(obj.<field>)``.

    For ``readonly_fields``: ``args_display = rendered_field("args", "Args")``.
    """

    @admin.display(description=description)
    def display(model_admin: Any, obj: Model) -> str:
        return render(getattr(obj, field))

    return display


def has_perm(request: HttpRequest, codename: str) -> bool:
    user = request.user
    return bool(user.is_active and user.has_perm(f"django_dispatch.{codename}"))


def username(request: HttpRequest) -> str:
    """Who to record as the operator (``replayed_by``)."""
    return request.user.get_username()


def id_list(ids: Iterable[int], limit: int = 20) -> str:
    """``#1, #2, …`` for messages, shortened when long."""
    ids = list(ids)
    shown = ", ".join(f"#{i}" for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


class ReplayPage(admin.ModelAdmin):
    """A row's "replay" page at ``<pk>/replay/``: URL, permission check, lookup, rendering.

    Shown only to users with the model's view permission and its
    ``replay_<model>`` permission, on GET and POST alike, so a forged POST
    changes nothing. The admin handles its form in ``replay_page`` and
    renders ``django_dispatch/admin/<model>_replay.html`` (an
    ``object_page.html``) with ``render_replay_page``.
    """

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, f"replay_{self.opts.model_name}")

    def replay_url(self, pk: Any) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_replay", args=[pk])
        return on_selected_alias(url)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.replay_view)
        name = f"{self.opts.app_label}_{self.opts.model_name}_replay"
        return [path("<path:object_id>/replay/", view, name=name), *super().get_urls()]

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not (self.has_view_permission(request) and self.has_replay_permission(request)):
            raise PermissionDenied
        obj = self.get_object(request, object_id)
        if obj is None:
            return self.replay_missing(request, object_id)
        return self.replay_page(request, obj)

    def replay_missing(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The answer for a row that does not exist (or not for this user)."""
        raise Http404(f"No {self.opts.verbose_name} with id {object_id!r}.")

    def replay_page(self, request: HttpRequest, obj: Any) -> HttpResponse:
        """The page for ``obj``: its form shown, or handled and redirected."""
        raise NotImplementedError

    def render_replay_page(
        self, request: HttpRequest, obj: Any, form: forms.Form, title: str, **extra: Any
    ) -> TemplateResponse:
        """The page in the change form's frame; ``extra`` adds to the template's context."""
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "subtitle": None,
            "opts": self.opts,
            "original": obj,
            "form": form,
            "has_view_permission": self.has_view_permission(request, obj),
            **extra,
        }
        request.current_app = self.admin_site.name
        template = f"django_dispatch/admin/{self.opts.model_name}_replay.html"
        return TemplateResponse(request, template, context)
