"""Fewer index entries per write of a workflow step or run: drop the step
table's index on ``run_id``, index its ``child_run_id`` only where it is set,
and drop the run table's (namespace, state, updated_at) index.

A step's state change is never a HOT update (``state`` is in the partial
indexes' conditions), so each one writes an entry into every index whose
condition its new row meets. ``run_id``'s own index repeated the leading
column of the unique (run, name) and (run, sequence) indexes, which serve
every lookup by run (a run's steps, the foreign key's check when a run is
deleted). ``child_run_id`` is NULL for every ``ctx.map`` child's step and
for every step that starts no child run, and the one lookup by it (a run's
deletion sets its parents' ``child_run_id`` to NULL; the foreign key's
check) matches a non-NULL value, which the partial index serves. No query
reads runs by ``updated_at``; their lookups by (namespace, state) are served
by ``dispatch_wfrun_list_state`` (namespace, state, id). Without it a run's
state change writes one entry fewer, and the run lock's touch of
``updated_at`` (no other column) can be a HOT update.

The partial index is built before the full one is dropped, so the lookup by
``child_run_id`` always has an index. On PostgreSQL each index is built with
``CREATE INDEX CONCURRENTLY`` and dropped with ``DROP INDEX CONCURRENTLY``:
both take a SHARE UPDATE EXCLUSIVE lock, which reads and writes of the table
(claims, successes, inserts) do not wait for; each waits for the
transactions already using the table to end, and the build reads the table
twice. Neither can run in a transaction, so this migration is not atomic:
one interrupted is run again (a build is skipped where a valid index of its
name exists, and first drops one a cancelled build left invalid; a drop is
``IF EXISTS``). On SQLite, Django rebuilds the step table as for any field
change (a copy, then the old table dropped and the new one renamed): each
operation runs in a transaction of its own there, since outside one a write
committed between the copy and the drop would be lost with the old table.
``django.contrib.postgres``'s concurrent operations are not used: their
import needs psycopg, which a site on SQLite alone may not have.
"""

from django.db import migrations, models, transaction
from django.db.models import Index


class Concurrently:
    """An index operation run concurrently on PostgreSQL, and in one transaction
    elsewhere: SQLite's table rebuild is four statements (copy, drop, rename,
    indexes), and a write committed between the copy and the drop would be
    lost with the old table. Subclasses give the PostgreSQL steps."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            model = to_state.apps.get_model(app_label, self.model_name)
            if self.allow_migrate_model(schema_editor.connection.alias, model):
                self.forwards_concurrently(schema_editor, model, app_label, from_state, to_state)
            return
        with transaction.atomic(using=schema_editor.connection.alias):
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            model = to_state.apps.get_model(app_label, self.model_name)
            if self.allow_migrate_model(schema_editor.connection.alias, model):
                self.backwards_concurrently(schema_editor, model, app_label, from_state, to_state)
            return
        with transaction.atomic(using=schema_editor.connection.alias):
            super().database_backwards(app_label, schema_editor, from_state, to_state)


def _valid_index(schema_editor, name):
    """True: index ``name`` exists and is valid; False: it exists, invalid (a
    cancelled concurrent build's leftover); None: it does not exist."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return None if row is None else bool(row[0])


def _build_concurrently(schema_editor, model, index):
    """Build ``index`` unless a valid one of its name exists: a run again after
    an interruption never leaves the column without its index meanwhile."""
    valid = _valid_index(schema_editor, index.name)
    if valid:
        return
    if valid is False:
        schema_editor.remove_index(model, index, concurrently=True)
    schema_editor.add_index(model, index, concurrently=True)


class AddIndexConcurrently(Concurrently, migrations.AddIndex):
    """``AddIndex``, without blocking the table's writes on PostgreSQL."""

    def forwards_concurrently(self, schema_editor, model, app_label, from_state, to_state):
        _build_concurrently(schema_editor, model, self.index)

    def backwards_concurrently(self, schema_editor, model, app_label, from_state, to_state):
        schema_editor.remove_index(model, self.index, concurrently=True)


class RemoveIndexConcurrently(Concurrently, migrations.RemoveIndex):
    """``RemoveIndex``, without blocking the table's writes on PostgreSQL."""

    def forwards_concurrently(self, schema_editor, model, app_label, from_state, to_state):
        state = from_state.models[app_label, self.model_name_lower]
        schema_editor.remove_index(model, state.get_index_by_name(self.name), concurrently=True)

    def backwards_concurrently(self, schema_editor, model, app_label, from_state, to_state):
        state = to_state.models[app_label, self.model_name_lower]
        _build_concurrently(schema_editor, model, state.get_index_by_name(self.name))


class DropFieldIndexConcurrently(Concurrently, migrations.AlterField):
    """``AlterField`` from ``db_index=True`` to ``db_index=False``, without
    blocking the table's writes on PostgreSQL.

    The index dropped is the one Django made for the field: found as
    ``AlterField`` finds it (a btree on the column alone, not one of
    ``Meta.indexes``), since its name carries a hash.
    """

    def forwards_concurrently(self, schema_editor, model, app_label, from_state, to_state):
        column = model._meta.get_field(self.name).column
        names = schema_editor._constraint_names(
            model,
            [column],
            index=True,
            type_=Index.suffix,
            exclude={index.name for index in model._meta.indexes},
        )
        for name in names:
            schema_editor.execute(schema_editor._delete_index_sql(model, name, concurrently=True))

    def backwards_concurrently(self, schema_editor, model, app_label, from_state, to_state):
        field = model._meta.get_field(self.name)
        create = schema_editor._create_index_sql(model, fields=[field], concurrently=True)
        name = str(create.parts["name"]).strip('"')
        valid = _valid_index(schema_editor, name)
        if valid:
            return
        if valid is False:  # a cancelled build's leftover
            schema_editor.execute(schema_editor._delete_index_sql(model, name, concurrently=True))
        schema_editor.execute(create)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_dispatch", "0036_wave_map_children")]

    operations = [
        AddIndexConcurrently(
            model_name="workflowtask",
            index=models.Index(
                models.F("child_run"),
                name="dispatch_wftask_child_run",
                condition=models.Q(child_run__isnull=False),
            ),
        ),
        DropFieldIndexConcurrently(
            model_name="workflowtask",
            name="child_run",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=models.deletion.SET_NULL,
                related_name="+",
                to="django_dispatch.workflowrun",
            ),
        ),
        DropFieldIndexConcurrently(
            model_name="workflowtask",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=models.deletion.CASCADE,
                related_name="steps",
                to="django_dispatch.workflowrun",
            ),
        ),
        RemoveIndexConcurrently(model_name="workflowrun", name="dispatch_wfrun_state"),
    ]
