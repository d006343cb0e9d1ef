"""Searching jobs by their arguments or call context, bounded to the newest jobs.

An operator hunting "the job for customer 42" types ``{"customer_id": 42}``
(keyword arguments, or the call context: ``{"user": 7}`` finds the jobs
enqueued with ``call_context={"user": 7, ...}``) or ``[42]`` (positional
ones) in the jobs search box.
Arguments have no index (one would slow every enqueue, for a search made
during incidents only), so the search reads only the newest
``ARGS_SEARCH_WINDOW`` jobs, a range of the primary key; older jobs are
found by id, task or key as before.

* PostgreSQL: JSON containment (``kwargs @> '{"customer_id": 42}'``,
  ``args @> '[42]'``), nested values included.
* SQLite has no containment: each top-level key of an object is compared
  with ``JSON_EXTRACT`` (``kwargs__customer_id=42``), and each element of a
  list is looked for in the arguments' JSON text.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connections
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast

#: Jobs (newest first, by id) an arguments search reads, at most.
ARGS_SEARCH_WINDOW = 100_000


def parse_arguments_term(term: str) -> dict[str, Any] | list[Any] | None:
    """The JSON object or list typed in the search box, or None for a plain search."""
    term = term.strip()
    if not term or term[0] not in "[{":
        return None
    try:
        value = json.loads(term)
    except ValueError:
        return None
    return value if isinstance(value, (dict, list)) else None


def arguments_filter(value: dict[str, Any] | list[Any], vendor: str) -> Q:
    if vendor == "postgresql":
        if isinstance(value, dict):
            return Q(kwargs__contains=value) | Q(call_context__contains=value)
        return Q(args__contains=value)
    if isinstance(value, dict):
        return Q(**{f"kwargs__{key}": item for key, item in value.items()}) | Q(
            **{f"call_context__{key}": item for key, item in value.items()}
        )
    q = Q()
    for item in value:
        q &= Q(dispatch_args_text__contains=json.dumps(item))
    return q


def search_arguments(queryset: QuerySet[Any], value: dict[str, Any] | list[Any]) -> QuerySet[Any]:
    """``queryset`` narrowed to jobs whose arguments contain ``value``, among the newest."""
    newest = queryset.model._default_manager.using(queryset.db).order_by("-pk").values("pk")[:1]
    top = newest[0]["pk"] if newest else 0
    vendor = connections[queryset.db].vendor
    if vendor != "postgresql" and isinstance(value, list):
        queryset = queryset.annotate(dispatch_args_text=Cast("args", TextField()))
    return queryset.filter(arguments_filter(value, vendor), pk__gt=top - ARGS_SEARCH_WINDOW)
