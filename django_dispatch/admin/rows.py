"""A change list's rows, rendered as Django renders them at a fraction of the cost.

Django builds every cell of a change list through ``items_for_result``: the
column looked up by name on the model and on the admin, the empty value
looked up, a ``format_html``, and for the linked column a ``reverse()`` and
``add_preserved_filters`` (a URL parsed and resolved again), per cell and per
row. On a page of 100 rows of ten columns that is most of the page's time
(about 0.4 ms a row, three to four times the time of the same list empty).
All of it but the value itself is the same for every row of a column: here
it is worked out once per page, and a cell is one call and a concatenation.

The markup is Django's, byte for byte (``tests/admin/test_admin_rows.py``
renders both and compares); a list this does not cover (editable rows, a
popup, a column that is a relation, a model's method or ``__str__``) is
left to Django, whole.
"""

from __future__ import annotations

import datetime
import inspect
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.contrib.admin.templatetags import admin_list
from django.contrib.admin.templatetags.admin_list import (
    ResultList,
    result_headers,
    results,
)
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.templatetags.base import InclusionAdminNode
from django.contrib.admin.utils import display_for_field, display_for_value
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured, ObjectDoesNotExist
from django.db import models
from django.template import Engine, TemplateDoesNotExist
from django.urls import NoReverseMatch
from django.utils.safestring import SafeString

from .display import html, one_page

#: One cell of a row: the row's model instance to the cell's HTML.
Cell = Callable[[Any], str]


def page_results(cl: Any) -> list[ResultList]:
    """The rows of the change list ``cl``, as ``admin_list.results`` gives them.

    Each row is one item, its cells already joined: the template then loops
    over 100 items a page, not 1,000.
    """
    cells = row_cells(cl)
    if cells is None:
        return list(results(cl))
    with one_page():  # the page's time zone and labels, looked up once (``display.per_page``)
        return [
            ResultList(None, [SafeString("".join([c(row) for c in cells]))])
            for row in cl.result_list
        ]


def row_cells(cl: Any) -> list[Cell] | None:
    """A renderer per column of ``cl.list_display``, or None: leave the page to Django."""
    if cl.formset is not None or cl.is_popup or cl.to_field:
        return None
    empty = cl.model_admin.get_empty_value_display()
    cells: list[Cell] = []
    first = True  # Django's: the first linked column is a <th>, the others <td>
    links = Links(cl)
    for index, name in enumerate(cl.list_display):
        if cl.list_display_links is None:
            link = False
        else:
            link = (first and not cl.list_display_links) or name in cl.list_display_links
        inner = column_cell(cl, index, name, empty)
        if inner is None:
            return None
        if link:
            cells.append(linked(inner, "th" if first else "td", links))
            first = False
        else:
            cells.append(in_td(inner))
    return cells


#: A column's renderer before its tag: (classes, inner HTML) of a row.
Inner = Callable[[Any], tuple[str, str]]


def column_cell(cl: Any, index: int, name: Any, empty: str) -> Inner | None:
    """What ``items_for_result`` makes of column ``name`` for a row: its classes and content."""
    if callable(name):  # Django's name for a callable's column (``_coerce_field_name``)
        named = f"lambda{index}" if name.__name__ == "<lambda>" else name.__name__
    else:
        named = name
    classes = f"field-{named}"
    model_admin = cl.model_admin
    if isinstance(name, str):
        try:
            field = cl.lookup_opts.get_field(name)
        except FieldDoesNotExist:
            field = None
        if field is not None:
            if field.is_relation or isinstance(field, (models.FileField, models.URLField)):
                return None  # a link, or a link Django leaves out in the linked column
            if not field.auto_created:
                return field_cell(classes, name, field, empty)
            return value_cell(classes, lambda row: getattr(row, name), None, empty)
        if name == "__str__" or not hasattr(model_admin, name):
            return None  # a model's attribute or method: Django's own path
        method = getattr(model_admin, name)
        return value_cell(classes, method, method, empty)
    if callable(name):
        return value_cell(classes, name, name, empty)
    return None


def field_cell(classes: str, name: str, field: Any, empty: str) -> Inner:
    if isinstance(field, (models.DateField, models.TimeField)):
        classes += " nowrap"
    if plain_numbers(field):

        def number(row: Any) -> tuple[str, str]:
            value = getattr(row, name)
            if type(value) is int:
                return classes, str(value)
            return classes, html(display_for_field(value, field, empty))

        return number

    def inner(row: Any) -> tuple[str, str]:
        return classes, html(display_for_field(getattr(row, name), field, empty))

    return inner


def plain_numbers(field: Any) -> bool:
    """Whether ``display_for_field`` shows this field's whole numbers as their digits.

    An integer field without choices is shown through ``number_format``,
    which groups digits only where the settings and the active language ask
    for it (a check of ``get_format`` per cell, most of a row's id cell): one
    number formatted for the page says whether it does.
    """
    if not isinstance(field, models.IntegerField) or field.flatchoices or field.name == "password":
        return False
    return all(str(display_for_field(n, field, "-")) == str(n) for n in (-1234567, 1234567))


def value_cell(classes: str, get: Callable[[Any], Any], attr: Any, empty: str) -> Inner:
    """A column read by a callable (the admin's method) or an automatic field (``id``)."""
    boolean = getattr(attr, "boolean", False)
    shown_empty = html(getattr(attr, "empty_value_display", empty))
    if classes == "field-action_checkbox":
        classes = "action-checkbox"
    dated = f"{classes} nowrap"
    icons: dict[Any, str] = {}  # a boolean column's three icons, each rendered once

    def inner(row: Any) -> tuple[str, str]:
        try:
            value = get(row)
        except ObjectDoesNotExist:
            return classes, html(empty)
        kind = type(value)
        if kind is SafeString and not boolean:  # most columns: display_for_value's own answer
            return classes, (value or shown_empty)
        if kind is str and not boolean:
            return classes, (escape(value.strip()) or shown_empty)
        if boolean and (value is None or kind is bool):
            if value not in icons:
                icons[value] = html(display_for_value(value, shown_empty, boolean))
            return classes, icons[value]
        shown = html(display_for_value(value, shown_empty, boolean))
        return (dated if isinstance(value, (datetime.date, datetime.time)) else classes), shown

    return inner


def in_td(inner: Inner) -> Cell:
    def cell(row: Any) -> str:
        classes, shown = inner(row)
        return f'<td class="{classes}">{shown}</td>'

    return cell


def linked(inner: Inner, tag: str, links: Links) -> Cell:
    def cell(row: Any) -> str:
        classes, shown = inner(row)
        href = links.href(row)
        if href is not None:
            shown = f'<a href="{href}">{shown}</a>'
        return f'<{tag} class="{classes}">{shown}</{tag}>'

    return cell


class Links:
    """Each row's change page URL with the list's filters preserved, as Django links it.

    ``add_preserved_filters`` gives every URL with the same query string the
    same new query string (the change pages differ in their path only), so
    it runs once per query string, not once per row.
    """

    def __init__(self, cl: Any) -> None:
        self.cl = cl
        self.context = {"preserved_filters": cl.preserved_filters, "opts": cl.opts}
        self.queries: dict[str, str] = {}
        #: Whole-number keys: one URL reversed, the others the same but for the key.
        self.numbered = (
            isinstance(cl.lookup_opts.pk, (models.AutoField, models.BigAutoField))
            and getattr(type(cl), "url_for_result", None) is ChangeList.url_for_result
        )
        self.around: tuple[str, str] | None = None
        #: ``around`` escaped: a whole number's digits need no escaping, and
        #: escaping works character by character, so the parts escaped apart
        #: make the whole URL escaped.
        self.escaped_around: tuple[str, str] | None = None

    def href(self, row: Any) -> str | None:
        """``url``, escaped for the ``href`` attribute."""
        pk = row.pk
        if self.escaped_around is not None and type(pk) is int:
            return f"{self.escaped_around[0]}{pk}{self.escaped_around[1]}"
        url = self.url(row)
        return None if url is None else html(url)

    def url(self, row: Any) -> str | None:
        pk = row.pk
        if self.around is not None and type(pk) is int:
            return f"{self.around[0]}{pk}{self.around[1]}"
        try:
            url = self.cl.url_for_result(row)
        except NoReverseMatch:
            return None
        url = self.preserved(url)
        key = f"/{pk}/"
        if self.numbered and type(pk) is int and url.count(key) == 1:
            head, tail = url.split(key)
            self.around = (f"{head}/", f"/{tail}")
            self.escaped_around = (html(self.around[0]), html(self.around[1]))
        return url

    def preserved(self, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme or parts.netloc or parts.fragment:
            return add_preserved_filters(self.context, url)
        query = self.queries.get(parts.query)
        if query is None:
            query = urlsplit(add_preserved_filters(self.context, url)).query
            self.queries[parts.query] = query
        return urlunsplit(parts._replace(query=query))


def result_list(cl: Any) -> dict[str, Any]:
    """``admin_list.result_list``'s context, its rows from ``page_results``."""
    if cl.formset is not None:  # editable rows: hidden fields and forms, Django's
        return admin_list.result_list(cl)
    headers = list(result_headers(cl))
    return {
        "cl": cl,
        "result_hidden_fields": [],  # editable rows' only
        "result_headers": headers,
        "num_sorted_fields": sum(1 for h in headers if h["sortable"] and h["sorted"]),
        "results": joined(cl, page_results(cl)),
    }


#: Django's own template of a change list's rows, which ``joined`` writes for.
STOCK_ROWS = Path(admin_list.__file__).resolve().parent.parent / "templates" / "admin"
#: Between two rows in it: a row's end, the loop's line breaks around its empty
#: form-errors block, the next row's start.
ROW_BREAK = "</tr>\n\n\n<tr>"


def joined(cl: Any, rows: list[ResultList]) -> list[ResultList]:
    """The page's rows as one item of one row, where Django's own template renders them.

    Its loop renders each row through a dozen template nodes (a form-errors
    test, an inner loop, a variable), a tenth of a page's time; joined with
    what that loop writes between two rows, the page is the same, byte for
    byte. A project's or app's own rows template gets the rows one by one.
    """
    if len(rows) < 2 or any(row.form is not None or len(row) != 1 for row in rows):
        return rows
    opts = cl.opts
    names = [
        f"admin/{opts.app_label.lower()}/{opts.model_name}/change_list_results.html",
        f"admin/{opts.app_label.lower()}/change_list_results.html",
        "admin/change_list_results.html",
    ]
    try:
        origin = Engine.get_default().select_template(names).origin.name
    except (ImproperlyConfigured, TemplateDoesNotExist):
        return rows
    if Path(origin).resolve() != STOCK_ROWS / "change_list_results.html":
        return rows
    return [ResultList(None, [SafeString(ROW_BREAK.join([row[0] for row in rows]))])]


def result_list_tag(parser: Any, token: Any) -> InclusionAdminNode:
    """``{% dispatch_result_list cl %}``: ``{% result_list cl %}``, its rows from here."""
    named = "name" in inspect.signature(InclusionAdminNode).parameters  # Django 6.0 on
    return InclusionAdminNode(
        **({"name": "dispatch_result_list"} if named else {}),
        parser=parser,
        token=token,
        func=result_list,
        template_name="change_list_results.html",
        takes_context=False,
    )
