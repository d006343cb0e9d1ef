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
select, a model with ``pre_init``/``post_init`` receivers, its own
``__init__`` or ``from_db``, a field with a descriptor of its own, a
``JSONField`` with a decoder or a ``from_db_value`` of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from django.db.models import JSONField, Model, QuerySet
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query import ModelIterable
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init

__all__ = ["QuickRows", "quick"]

#: JSON texts parsed without ``json.loads``: a new value each time (a caller may change it).
CONSTANTS: dict[str, Callable[[], Any]] = {
    "[]": list,
    "{}": dict,
    "null": lambda: None,
    "true": lambda: True,
    "false": lambda: False,
}

_json_from_db = JSONField.from_db_value
_model_from_db = Model.__dict__["from_db"].__func__


def quick[M: Model](rows: QuerySet[M]) -> QuerySet[M]:
    """``rows``, iterated by ``QuickRows``: the same instances, built faster."""
    rows = rows._chain()  # type: ignore[attr-defined]
    rows._iterable_class = QuickRows
    return rows


def plain(model: type[Model]) -> bool:
    """Whether Django's ``from_db`` for ``model`` is exactly "set each selected field"."""
    return (
        model.__init__ is Model.__init__
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
            query.select_related
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
        results = compiler.execute_sql(chunked_fetch=self.chunked_fetch, chunk_size=self.chunk_size)
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

    def _built(self, compiler: Any, results: Any, model: type[Model]) -> Iterator[Any]:
        """Django's way, for a select this module does not cover (already run)."""
        queryset = self.queryset
        fields = compiler.klass_info["select_fields"]
        start, end = fields[0], fields[-1] + 1
        names = [s[0].target.attname for s in compiler.select[start:end]]
        fetch_mode = queryset._fetch_mode  # type: ignore[attr-defined]
        for row in compiler.results_iter(results):
            yield model.from_db(queryset.db, names, row[start:end], fetch_mode=fetch_mode)

    def _quick(
        self, compiler: Any, results: Any, model: type[Model], fields: list[Any], db: str
    ) -> Iterator[Any]:
        connection = compiler.connection
        converters = compiler.get_converters([s[0] for s in compiler.select])
        convert = []
        for position, (functions, expression) in converters.items():
            for function in functions:
                if getattr(function, "__func__", None) is _json_from_db and (
                    function.__self__.decoder is None
                ):
                    function = _quick_json(function)
                convert.append((position, function, expression))
        names = [f.attname for f in fields]
        fetch_mode = self.queryset._fetch_mode  # type: ignore[attr-defined]
        # Setting a foreign key's id (not None) makes Django's instance look up,
        # and so create, its state's empty cache of related objects.
        related = [
            n
            for n, f in enumerate(fields)
            if type(_descriptor(model, f.attname)) is ForeignKeyDeferredAttribute
        ]
        new = model.__new__
        for rows in results:
            for row in rows:
                if convert:
                    row = list(row)
                    for position, function, expression in convert:
                        row[position] = function(row[position], expression, connection)
                obj = new(model)
                state = ModelState()
                if related and any(row[n] is not None for n in related):
                    state.fields_cache = {}
                state.adding = False
                state.db = db
                state.fetch_mode = fetch_mode
                values = obj.__dict__
                values["_state"] = state
                values.update(zip(names, row, strict=False))
                yield obj


def _quick_json(parse: Callable[..., Any]) -> Callable[..., Any]:
    """``JSONField.from_db_value`` with its common constants answered without parsing."""
    constants = CONSTANTS

    def from_db(value: Any, expression: Any, connection: Any) -> Any:
        if type(value) is str:
            make = constants.get(value)
            if make is not None:
                return make()
        return parse(value, expression, connection)

    return from_db
