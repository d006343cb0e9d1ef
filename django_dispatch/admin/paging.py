"""Change lists that stay cheap on a table of millions of rows: the count, the page, the filters.

The job table can hold millions of finished rows, so nothing here may cost a
scan of it: the paginator counts at most ``COUNT_CAP`` rows, and the value
filters sample recent rows instead of ``SELECT DISTINCT`` over the table.

A change list is one query, and an index serves it only if its condition is
in that query: the job list's indexes for a state, queue or task hold the
finished jobs only (a partial index, so the claim's writes never touch
them), which a query over every state cannot use. So a model admin may
split its rows into *parts* (``BigTable.list_parts``), each read through its
own index: the page, newest first, is the newest rows of each part merged,
and the count is the parts' capped counts added up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from ..queries.counting import capped_count
from ..queries.lists import newest_of
from ..queries.reading import read_alias
from ..store.base import db_alias

#: The changelist counts at most this many matching rows (then shows "more
#: than"); pages beyond it are reached by narrowing with filters or search.
COUNT_CAP = 10_000
#: Value filters (task path, queue, error class) offer the values found among
#: this many most recent rows (a value seen only in older ones is still
#: reached by URL or search). Their DISTINCT costs about 1 us a row per page
#: load, the largest share of a job list's page beside its own rows.
FILTER_SAMPLE = 1_000


class CappedPaginator(Paginator):
    """A paginator whose count is ``SELECT COUNT(*) FROM (… LIMIT cap + 1)``.

    Django's paginator runs an unbounded ``COUNT(*)``, a full scan of a big
    table on PostgreSQL. Counting through a LIMIT stops early
    (``capped_count``); when the cap is hit the count is reported as the cap
    and ``capped`` is set, so the template says "more than". With ``parts``
    (``BigTable.list_parts``) each part is counted so, through its own index.
    """

    cap = COUNT_CAP
    #: Set once ``count`` has run: more than ``cap`` rows match.
    capped = False
    #: The querysets whose union is ``object_list``, each counted apart; None: one.
    parts: Sequence[QuerySet[Any]] | None = None

    @cached_property
    def count(self) -> int:
        object_list = self.object_list
        if not isinstance(object_list, QuerySet):
            return super().count
        counted = 0
        for part in self.parts or [object_list]:
            # Each part is counted only as far as the cap still needs: past it
            # the page says "more than" whatever the parts after hold, so a
            # history that fills the cap alone leaves the live part unread.
            if counted > self.cap:
                break
            n, more = capped_count(part, self.cap - counted)
            counted += n + more
        self.capped = counted > self.cap
        return min(counted, self.cap)


def listed_fields(model_admin: Any, request: HttpRequest) -> list[str] | None:
    """The model fields a change list's rows are read with, or None: every field.

    A page builds 100 model instances, and a job has 39 columns, nine of them
    JSON decoded one by one, most shown on its own page only. A model admin's
    ``list_reads`` names the fields each of its columns reads (the key ``""``:
    what every row needs, its ``__str__`` and the page's lookups); a column it
    does not name and that is no field of the model (one a subclass adds)
    makes the page read every field, never a query per row for a field left
    out.
    """
    reads: dict[str, Sequence[str]] | None = getattr(model_admin, "list_reads", None)
    if not reads:
        return None
    opts = model_admin.model._meta
    concrete = {field.name for field in opts.concrete_fields}
    wanted = {opts.pk.name, *reads.get("", ())}
    for column in model_admin.get_list_display(request):
        if isinstance(column, str) and column in reads:
            wanted.update(reads[column])
        elif isinstance(column, str) and column in concrete:
            wanted.add(column)
        else:
            return None
    return sorted(wanted)


def list_database(request: HttpRequest) -> str:
    """The database a changelist request reads (see ``common.BigTable``)."""
    return read_alias() if getattr(request, "dispatch_reads_replica", False) else db_alias()


def newest_first(rows: QuerySet[Any]) -> bool:
    """Whether ``rows`` is ordered by its primary key, descending, and by nothing else."""
    order = list(rows.query.order_by) or list(rows.model._meta.ordering)
    pk = rows.model._meta.pk
    return len(order) == 1 and order[0] in ("-pk", f"-{pk.name}", f"-{pk.attname}")


def merged_rows(
    rows: QuerySet[Any], parts: Sequence[QuerySet[Any]], low: int, high: int
) -> list[Any]:
    """Rows ``low`` to ``high`` (newest first by primary key) of ``rows``, the parts' union.

    Each part reads the ids of its newest ``high`` rows through its own index
    (page N costs what N pages of one part do); the ids are merged in the
    same statement, and only the page's rows are read and built
    (``queries.lists.newest_of``).
    """
    return list(newest_of(rows, list(parts), low, high))


class RecentValuesFilter(admin.AllValuesFieldListFilter):
    """Filter by a column's values, offering those seen among recent rows.

    ``AllValuesFieldListFilter`` runs ``SELECT DISTINCT column`` over the whole
    table on every changelist load. Sampling the newest ``FILTER_SAMPLE`` rows
    (through the primary key) bounds that; a value only found in older rows
    can still be filtered on by URL or search, and a selected value is always
    listed.
    """

    def __init__(self, field, request, params, model, model_admin, field_path):
        super().__init__(field, request, params, model, model_admin, field_path)
        database = list_database(request)
        found = sampled_values(request, model, model_admin, database).get(field.name)
        if found is None:  # a filter not in the admin's list_filter (built elsewhere)
            found = recent_values(model, [field.name], database)[field.name]
        values = set(found)
        values.update(self.lookup_val or [])
        # A list where Django has a queryset: choices() only iterates it.
        self.lookup_choices = sorted(  # type: ignore[assignment]
            values, key=lambda v: (v is None, str(v))
        )


def sampled_values(
    request: HttpRequest, model: Any, model_admin: Any, database: str
) -> dict[str, set[Any]]:
    """The values of every ``RecentValuesFilter`` column of ``model_admin``'s list, read
    together: one sample of the newest rows for the page, not one per filter."""
    cache = request.__dict__.setdefault("_dispatch_sampled_values", {})
    key = (model, database)
    if key not in cache:
        fields = [
            spec[0]
            for spec in model_admin.get_list_filter(request)
            if isinstance(spec, (list, tuple))
            and isinstance(spec[1], type)
            and issubclass(spec[1], RecentValuesFilter)
            and "__" not in spec[0]
        ]
        # No such filter (a caller's own list_filter): no sample, and no
        # ``values_list()`` of every column.
        cache[key] = recent_values(model, fields, database) if fields else {}
    return cache[key]


def recent_values(model: Any, fields: Sequence[str], database: str) -> dict[str, set[Any]]:
    """The distinct values of each of ``fields`` among the newest ``FILTER_SAMPLE`` rows.

    ``SELECT DISTINCT * FROM (the newest rows, by primary key, LIMIT n)``:
    the LIMIT keeps the sample a subquery of its own, read off the primary
    key's index, and only the few distinct combinations leave the database
    (the sample's rows, fetched and de-duplicated here, cost as much as the rest
    of the filter). The ORM has no DISTINCT over a sliced subquery, and
    ``pk IN (newest ids)`` with DISTINCT let the planner join the sample to
    a scan of the whole table once it had a few hundred thousand rows. All
    the filters' columns are read in one sample: three filters cost one
    read of the newest rows, not three.
    """
    sample = model._default_manager.using(database).order_by("-pk").values_list(*fields)
    sql, params = sample[:FILTER_SAMPLE].query.get_compiler(using=database).as_sql()
    with connections[database].cursor() as cursor:  # the sample's columns
        cursor.execute(f"SELECT DISTINCT * FROM ({sql}) sample", params)
        rows = cursor.fetchall()
    return {name: {row[n] for row in rows} for n, name in enumerate(fields)}
