"""On PostgreSQL, the wave's finish and leases find their rows through the
primary key whatever the plan: ``j.id = ANY(<the ids>)`` beside the join.

0027's and 0030's functions force a generic plan, made at a session's first
call from the job table's size and statistics at that moment. Made while the
table was small (a fresh database, a worker started before a backlog arrived,
a ``ctx.map`` set inserted after the workers started), the plan joined the
ids to a full scan of the primary key, kept for the session: each wave then
read every job row (a wave of 5 on 20,000 rows: 140 ms instead of 0.1). With
the ids also an index condition of the job table, every plan reads only the
wave's rows.

The texts are 0030's, changed only there (each change is checked to apply
exactly once). Reversible: the reverse restores 0030's texts.
"""

import importlib

from django.db import migrations

_0030 = importlib.import_module("django_dispatch.migrations.0030_keyed_wave")

#: (0030's text, the change) for each UPDATE ... FROM unnest(ids) of the wave.
_CHANGES = [
    (
        "WHERE j.id = d.id AND (j.state = 'running') IS TRUE",
        "WHERE j.id = ANY(p_ids) AND j.id = d.id AND (j.state = 'running') IS TRUE",
    ),
    (
        "WHERE j.id = d.id AND j.state = 'pending';",
        "WHERE j.id = ANY(p_ids) AND j.id = d.id AND j.state = 'pending';",
    ),
    (
        "WHERE j.id = d.id AND (j.state = 'pending') IS TRUE AND (d.partition_key",
        "WHERE j.id = ANY(p_ids) AND j.id = d.id AND (j.state = 'pending') IS TRUE"
        " AND (d.partition_key",
    ),
    (
        "WHERE j.id = d.id AND (j.state = 'pending') IS TRUE\n            AND j.partition_key",
        "WHERE j.id = ANY(waiting) AND j.id = d.id AND (j.state = 'pending') IS TRUE\n"
        "            AND j.partition_key",
    ),
]


def _changed(texts):
    out = []
    for text in texts:
        for old, new in _CHANGES:
            if text.count(old) > 1:
                raise AssertionError(f"0030's text holds {old!r} more than once")
            text = text.replace(old, new)
        out.append(text)
    if sum(t.count("ANY(p_ids) AND j.id = d.id") for t in out) != 3:
        raise AssertionError("0030's texts changed: the wave's lookups were not all found")
    return out


ORIGINAL = (_0030.FINISH, _0030.LEASE, _0030.LEASE_RUNNABLE)
CHANGED = _changed(ORIGINAL)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in CHANGED:
            schema_editor.execute(sql)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in ORIGINAL:
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0030_keyed_wave")]
    operations = [migrations.RunPython(create, restore)]
