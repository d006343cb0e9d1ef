"""Small SQL expressions the ORM lacks, one definition per database vendor."""

import json
from collections.abc import Iterable
from typing import Any

from django.db.models import Func, JSONField, Value


class JSONAppend(Func):
    """``array || [value]`` for a JSON array column, evaluated in the database.

    PostgreSQL and SQLite only (system check E013 rejects other databases).

    Lets one bulk UPDATE append a different history entry to many rows (the
    claim records each attempt's worker id) without reading them first.
    """

    output_field = JSONField()

    def __init__(self, field: str, value: Any) -> None:
        super().__init__(field, Value(json.dumps(value)))

    def _parts(self, compiler, connection):
        array_sql, array_params = compiler.compile(self.source_expressions[0])
        value_sql, value_params = compiler.compile(self.source_expressions[1])
        return array_sql, value_sql, (*array_params, *value_params)

    def as_postgresql(self, compiler, connection, **extra_context):
        array_sql, value_sql, params = self._parts(compiler, connection)
        sql = f"(COALESCE({array_sql}, '[]'::jsonb) || jsonb_build_array(({value_sql})::jsonb))"
        return sql, params

    def as_sqlite(self, compiler, connection, **extra_context):
        array_sql, value_sql, params = self._parts(compiler, connection)
        return f"json_insert(COALESCE({array_sql}, '[]'), '$[#]', json({value_sql}))", params


# PostgreSQL array literals, for the hot statements' array parameters.
#
# A Python list handed to psycopg is adapted element by element (a dumper
# looked up per list, each element dumped in Python): for the wave's arrays,
# a tenth of a busy worker's CPU. One ``str`` each,
# joined in C where it can be, is a single text parameter the statement casts
# (``%(ids)s::bigint[]``): the same values, the server parsing what psycopg
# would otherwise have built.


def int_array(values: Iterable[int]) -> str:
    """``values`` (ints) as a PostgreSQL array literal."""
    return "{" + ",".join(map(str, values)) + "}"


def float_array(values: Iterable[float | None]) -> str:
    """``values`` (floats or None) as a PostgreSQL array literal; ``repr`` is exact."""
    return "{" + ",".join("NULL" if v is None else repr(float(v)) for v in values) + "}"


def bool_array(values: Iterable[bool]) -> str:
    """``values`` (booleans) as a PostgreSQL array literal."""
    return "{" + ",".join("t" if v else "f" for v in values) + "}"


def text_array(values: Iterable[str | None]) -> str:
    """``values`` (text or None) as a PostgreSQL array literal: each element
    double-quoted with its backslashes and quotes escaped, so any text (a JSON
    document, ``NULL``, braces, commas) stays one element of the same value."""
    return (
        "{"
        + ",".join(
            "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            for v in values
        )
        + "}"
    )
