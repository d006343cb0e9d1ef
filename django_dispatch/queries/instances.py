"""Model instances for the pages operators read, built at a fraction of Django's cost.

A page of 100 jobs spent most of its time on each row's instance, not on
the query: ``Model.__init__`` sends two signals and sets each field in a
loop of ``setattr`` calls, and ``JSONField`` parses every value through
``json.loads``, though a job's ``args``, ``kwargs`` and ``errors`` are
mostly ``[]``, ``{}`` or ``null``. ``QuickRows`` (a queryset's iterable
class: ``quick(rows)``) builds the same instances: the fields' values in
the instance's ``__dict__`` in the same order, the same ``_state``, the
same values (a JSON value that is one of those constants is made anew
each time, a list or dict the caller may change), and falls back to
Django's own iterable wherever it could differ: a related or annotated
select, a model with ``pre_init``/``post_init`` receivers, an ``__init__``,
``__setattr__`` or ``from_db`` of its own or of a mixin's, a field with a
descriptor of its own, a ``JSONField`` with a decoder or a ``from_db_value``
of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC
from typing import Any

import django
from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db.models import JSONField, Model, QuerySet
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query import ModelIterable
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init

try:  # Django's PostgreSQL backend reads through psycopg 3 when it is installed
    import psycopg
    from psycopg.pq import Format
except ImportError:  # SQLite only, or psycopg2: Django's own loading stays
    psycopg = None  # type: ignore[assignment]

__all__ = ["QuickRows", "quick"]

#: JSON texts parsed without ``json.loads``: a new value each time (a caller may change it).
CONSTANTS: dict[str, Callable[[], Any]] = {
    "[]": list,
    "{}": dict,
    "null": lambda: None,
    "true": lambda: True,
    "false": lambda: False,
}

#: The Django whose ``Model.from_db`` and ``ModelState`` this module mirrors
#: (its fetch modes among them, which 5.2 and 6.0 lack). Any other version gets
#: Django's own iterable: a list there costs what Django's costs, never a
#: wrong instance.
MIRRORED = django.VERSION[:2] == (6, 1)

_json_from_db = JSONField.from_db_value
_model_from_db = Model.__dict__["from_db"].__func__
#: ``Model`` and its own bases: their ``__init__`` is the one ``from_db`` mirrors.
_DJANGOS = frozenset(Model.__mro__)


def quick[M: Model](rows: QuerySet[M]) -> QuerySet[M]:
    """``rows``, iterated by ``QuickRows``: the same instances, built faster."""
    if not MIRRORED or rows._iterable_class is not ModelIterable:  # type: ignore[attr-defined]
        return rows  # values(), values_list(), or a caller's own iterable: not instances
    rows = rows._chain()  # type: ignore[attr-defined]
    rows._iterable_class = QuickRows
    return rows


def plain(model: type[Model]) -> bool:
    """Whether Django's ``from_db`` for ``model`` is exactly "set each selected field".

    Not if any class of the model's own defines ``__init__`` (a mixin after
    ``Model`` is reached by its ``super().__init__()``, though ``model.__init__``
    is still Django's) or ``__setattr__`` (the fields are put straight in the
    instance's ``__dict__``).
    """
    return (
        not any(
            "__init__" in klass.__dict__ or "__setattr__" in klass.__dict__
            for klass in model.__mro__
            if klass not in _DJANGOS
        )
        and getattr(model.from_db, "__func__", None) is _model_from_db
        and not pre_init.has_listeners(model)
        and not post_init.has_listeners(model)
    )


def _descriptor(model: type[Model], attname: str) -> Any:
    """The class attribute ``attname`` of ``model`` (or of its bases), unbound."""
    for klass in model.__mro__:
        if attname in klass.__dict__:
            return klass.__dict__[attname]
    return None


def _settable(model: type[Model], attname: str) -> bool:
    """Whether ``setattr(instance, attname, v)`` on a new instance stores v in its ``__dict__``."""
    descriptor = _descriptor(model, attname)
    # A DeferredAttribute (a field's own, or a foreign key's id, whose setter
    # only drops a cached related object, which a new instance has none of);
    # not a subclass of it (a file field's wraps what it is given).
    return type(descriptor) in (DeferredAttribute, ForeignKeyDeferredAttribute)


class QuickRows(ModelIterable):
    """``ModelIterable`` for a plain select of one model's fields (see the module docstring)."""

    def __iter__(self) -> Iterator[Any]:
        queryset = self.queryset
        query = queryset.query
        model = queryset.model
        if (
            not MIRRORED
            or query.select_related
            or query.annotation_select
            or query.extra_select
            or queryset._known_related_objects  # type: ignore[attr-defined]
            or queryset._fetch_mode.track_peers  # type: ignore[attr-defined]
            or not plain(model)
        ):
            yield from super().__iter__()
            return
        db = queryset.db
        compiler = query.get_compiler(using=db)
        results = self._fetch(compiler)
        select, klass_info = compiler.select, compiler.klass_info
        fields = [s[0].target for s in select]
        if (
            klass_info is None
            or klass_info["model"] is not model
            or list(klass_info["select_fields"]) != list(range(len(select)))
            or compiler.col_count != len(select)
            or compiler.has_composite_fields([s[0] for s in select])
            or not all(_settable(model, f.attname) for f in fields)
        ):
            yield from self._built(compiler, results, model)
            return
        yield from self._quick(compiler, results, model, fields, db)

    def _fetch(self, compiler: Any) -> Any:
        """The select's rows, as ``compiler.execute_sql`` returns them (a list of chunks).

        On PostgreSQL with psycopg 3 and the connection in UTC, each
        ``timestamptz`` is loaded by psycopg's own loader (C), not through
        Django's wrapper around it, which sets the connection's tzinfo on
        the value it returns: with the session in UTC, psycopg's value
        already has it (``datetime.UTC``, the same object). A job has
        eight timestamps; through the wrapper they were a tenth of a page's
        time.
        """
        connection = compiler.connection
        if self.chunked_fetch or not _utc_session(connection):
            return compiler.execute_sql(
                chunked_fetch=self.chunked_fetch, chunk_size=self.chunk_size
            )
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:
            return []
        with connection.cursor() as cursor:
            cursor.cursor.adapters.register_loader("timestamptz", TIMESTAMPTZ)
            cursor.execute(sql, params)
            return [cursor.fetchall()]

    def _built(self, compiler: Any, results: Any, model: type[Model]) -> Iterator[Any]:
        """Django's way, for a select this module does not cover (already run)."""
        queryset = self.queryset
        fields = compiler.klass_info["select_fields"]
        built = compiler.klass_info["model"]  # what Django's own iterable builds
        start, end = fields[0], fields[-1] + 1
        names = [s[0].target.attname for s in compiler.select[start:end]]
        fetch_mode = queryset._fetch_mode  # type: ignore[attr-defined]
        for row in compiler.results_iter(results):
            yield built.from_db(queryset.db, names, row[start:end], fetch_mode=fetch_mode)

    def _quick(
        self, compiler: Any, results: Any, model: type[Model], fields: list[Any], db: str
    ) -> Iterator[Any]:
        connection = compiler.connection
        converters = compiler.get_converters([s[0] for s in compiler.select])
        # (position, converter, expression, whether a JSON constant may be answered
        # first), in Django's order: a value goes through its converters in turn.
        steps = [
            (position, function, expression, _plain_json(function))
            for position, (functions, expression) in converters.items()
            for function in functions
        ]
        names = [f.attname for f in fields]
        # Setting a foreign key's id (not None) makes Django's instance look up,
        # and so create, its state's empty cache of related objects.
        related = [
            n
            for n, f in enumerate(fields)
            if type(_descriptor(model, f.attname)) is ForeignKeyDeferredAttribute
        ]
        # Set in this order by ``from_db`` after ``__init__``.
        loaded = {"adding": False, "db": db, "fetch_mode": self.queryset._fetch_mode}  # type: ignore[attr-defined]
        constants = CONSTANTS
        new = model.__new__
        for rows in results:
            for row in rows:
                if steps:
                    row = list(row)
                    for position, function, expression, json in steps:
                        value = row[position]
                        if json and type(value) is str:
                            make = constants.get(value)
                            if make is not None:
                                row[position] = make()
                                continue
                        row[position] = function(value, expression, connection)
                obj = new(model)
                state = ModelState()
                for n in related:
                    if row[n] is not None:
                        state.fields_cache = {}
                        break
                state.__dict__.update(loaded)
                values = obj.__dict__
                values["_state"] = state
                values.update(zip(names, row, strict=False))
                yield obj


def _utc_session(connection: Any) -> bool:
    """Whether ``connection`` reads through psycopg 3 with Django's tzinfo
    ``datetime.UTC`` (``USE_TZ``, no ``TIME_ZONE`` of the database's: Django
    keeps the session in UTC)."""
    return (
        TIMESTAMPTZ is not None
        and connection.vendor == "postgresql"
        and settings.USE_TZ
        and connection.settings_dict.get("TIME_ZONE") is None
        and connection.timezone is UTC
    )


#: psycopg's own text loader of timestamptz (its C one with psycopg[binary]).
TIMESTAMPTZ = (
    None
    if psycopg is None
    else psycopg.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, Format.TEXT)
)


def _plain_json(function: Any) -> bool:
    """Whether ``function`` is ``JSONField.from_db_value`` of a field without a decoder:
    the texts of ``CONSTANTS`` are then those values, nothing else."""
    return getattr(function, "__func__", None) is _json_from_db and (
        function.__self__.decoder is None
    )
