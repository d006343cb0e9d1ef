"""Drop the admin's three job list indexes (finished jobs by state, queue or task,
in every namespace): the admin now reads its list one namespace at a time
through the list indexes led by the namespace (``dispatch_job_list_*``), merged
by id.

A state change is never a HOT update (``state`` is in every partial index's
condition), so a job that finishes writes one entry into every index whose
condition its new row meets: these three were three of the eight a success
wrote, for one admin page.

On PostgreSQL each is dropped with ``DROP INDEX CONCURRENTLY``: it takes a
SHARE UPDATE EXCLUSIVE lock, which enqueues, claims and finishes do not wait
for, and waits itself for the transactions already using the table to end.
It cannot run in a transaction, so this migration is not atomic: one
interrupted is run again (``IF EXISTS``: what it dropped before stays
dropped, and an index a cancelled drop left invalid is dropped now).
Django's own ``RemoveIndexConcurrently`` lives in ``django.contrib.postgres``,
whose import needs psycopg: a site on SQLite alone could not load this file.
"""

from django.db import migrations


class RemoveIndexConcurrently(migrations.RemoveIndex):
    """``RemoveIndex``, without blocking the table's writes on PostgreSQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            name = schema_editor.quote_name(self.name)
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            # An interrupted earlier run may have left this index invalid: drop it first.
            name = schema_editor.quote_name(self.name)
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            schema_editor.add_index(model, index, concurrently=True)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_dispatch", "0033_map_child_finish"),
    ]

    operations = [
        RemoveIndexConcurrently(model_name="job", name=f"dispatch_job_admin_{name}")
        for name in ("state", "queue", "task")
    ]
