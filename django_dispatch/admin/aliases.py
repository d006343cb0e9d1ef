"""The alias selector: which TASKS alias's database an admin page reads and acts on.

A site whose aliases keep their rows in databases of their own
(``TASKS[alias]["OPTIONS"]["DATABASE"]``) picks one with ``?alias=NAME``:
the change lists offer it as a filter, and every view of our ModelAdmins
(the change lists, the change pages, the actions' POSTs, the replay pages,
the console) runs inside ``store.using_backend(NAME)``, so that everything
the page reads, and every service its actions call, is on that database.
Without it a page is on the ``default`` alias's database. A
change page reached from a change list keeps the choice through Django's
preserved filters (``_changelist_filters``), and so do its POSTs.

A site with one database (every alias without ``DATABASE``, or naming the
same one) is not offered the filter: there is nothing to choose.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern

from ..store import database_for, db_alias, routed_database, using_backend
from ..tasks.registry import backend_for, dispatch_aliases

#: The querystring parameter naming the alias.
PARAM = "alias"


def alias_databases() -> dict[str, str]:
    """Each DispatchBackend alias's database, by alias (sorted)."""
    return {alias: database_for(alias) for alias in dispatch_aliases()}


def several_databases() -> bool:
    """Whether the aliases' rows live in more than one database."""
    return len(set(alias_databases().values())) > 1


def selected_alias(request: HttpRequest) -> str | None:
    """The DispatchBackend alias ``request`` picked, None when it picked none.

    ``?alias=``, in the querystring or in the change list's preserved filters;
    else the alias of the namespace it names (``?namespace=`` of the console,
    a change list's namespace filter, a POSTed form's ``namespace``): aliases
    sharing a namespace share a database (system check E051), so a namespace
    names one database. An unknown alias or namespace picks nothing.
    """
    params = _params(request)
    alias = params.get(PARAM)
    if alias is not None:
        return alias if backend_for(alias) is not None else None
    for key in NAMESPACE_PARAMS:
        namespace = params.get(key)
        if namespace is not None:
            return _alias_of(namespace)
    return None


#: Where a request names a namespace (the console, the namespace filter, a form).
NAMESPACE_PARAMS = ("namespace", "namespace__exact")


def _params(request: HttpRequest) -> dict[str, str]:
    found: dict[str, str] = {}
    if request.method == "POST" and request.content_type == "application/x-www-form-urlencoded":
        for key in NAMESPACE_PARAMS:
            value = request.POST.get(key)
            if isinstance(value, str):
                found[key] = value
    preserved = parse_qs(request.GET.get("_changelist_filters", ""))
    found.update((k, v[0]) for k, v in preserved.items() if v)
    for key in (PARAM, *NAMESPACE_PARAMS):
        value = request.GET.get(key)
        if isinstance(value, str):
            found[key] = value
    return found


#: The alias the request being served picked (``alias_scoped``); None on a
#: site with one database, or when the request picked none.
_SELECTED: ContextVar[str | None] = ContextVar("django_dispatch_admin_alias", default=None)


def on_selected_alias(url: str) -> str:
    """``url`` with ``alias=`` of the alias the current request picked, if any.

    Ids are unique within one database only: a link from a page of alias
    ``eu`` to row 7 of another model must open ``eu``'s row 7, not the
    default database's, or an operator could cancel or replay the wrong one.
    Django's preserved filters carry the choice from a change list to its
    own change pages; the links we build to other models carry it here.
    """
    alias = _SELECTED.get()
    if alias is None or PARAM in parse_qs(urlsplit(url).query):
        return url
    return f"{url}{'&' if '?' in url else '?'}{urlencode({PARAM: alias})}"


def _alias_of(namespace: str) -> str | None:
    for alias in dispatch_aliases():
        backend = backend_for(alias)
        if backend is not None and backend.namespace == namespace:
            return alias
    return None


def alias_scoped(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``view`` run on the database of the alias its request picked."""

    @functools.wraps(view)
    def scoped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        alias = selected_alias(request) if several_databases() else None
        if alias is None:  # a site with one database: exactly as without aliases
            return view(request, *args, **kwargs)
        token = _SELECTED.set(alias)
        try:
            with using_backend(alias):
                response = view(request, *args, **kwargs)
                render = getattr(response, "render", None)
                if render is not None and not getattr(response, "is_rendered", True):
                    render()  # a TemplateResponse reads its querysets while rendering
                return response
        finally:
            _SELECTED.reset(token)

    return scoped


class AliasFilter(admin.SimpleListFilter):
    """The change lists' selector: one choice per DispatchBackend alias.

    The database is chosen around the whole view (``alias_scoped``); the
    filter itself narrows rows with a namespace to the alias's, since
    several aliases may share one database.
    """

    title = "alias (database)"
    parameter_name = PARAM

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(alias, f"{alias} ({db})") for alias, db in alias_databases().items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        alias = self.value()
        backend = backend_for(alias) if alias else None
        if backend is None:
            return queryset
        if any(f.name == "namespace" for f in queryset.model._meta.get_fields()):
            queryset = queryset.filter(namespace=backend.namespace)
        return queryset


class AliasSelector:
    """Mixin for our ModelAdmins (leftmost): every view routed by ``?alias=``, and
    the selector among the change list's filters where there is a choice."""

    def get_urls(self) -> list[URLPattern]:
        patterns = super().get_urls()  # type: ignore[misc]
        for pattern in patterns:
            if isinstance(pattern, URLPattern):
                pattern.callback = alias_scoped(pattern.callback)
        return patterns

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows = super().get_queryset(request)  # type: ignore[misc]
        if rows._db is None and routed_database() is not None:  # no database chosen above
            rows = rows.using(db_alias())
        return rows

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        """The form; on an add page under ``?alias=``, its new object is on the
        alias's database from the start: a new instance has no database, and the
        form's uniqueness checks and the save would otherwise go to the routers'."""
        form = super().get_form(request, obj, change=change, **kwargs)  # type: ignore[misc]
        if obj is not None or routed_database() is None:
            return form
        database = db_alias()

        class OnAliasDatabase(form):  # type: ignore[valid-type,misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                if self.instance._state.adding and self.instance._state.db is None:
                    self.instance._state.db = database

        OnAliasDatabase.__name__ = form.__name__
        return OnAliasDatabase

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """A new object under ``?alias=`` is written on the alias's database,
        whatever the project's routers say for the model."""
        if not change and routed_database() is not None:
            obj.save(using=db_alias())
            return
        super().save_model(request, obj, form, change)  # type: ignore[misc]

    def get_list_filter(self, request: HttpRequest) -> Any:
        shown = list(super().get_list_filter(request))  # type: ignore[misc]
        if several_databases():
            shown.insert(0, AliasFilter)
        return shown
