"""Small SQL expressions the ORM lacks, one definition per database vendor."""

import json
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
