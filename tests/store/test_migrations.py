"""The models and the migrations agree: a model change without its migration
would ship a schema that users' ``migrate`` never creates."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from django_dispatch.models import Job


@pytest.mark.django_db
def test_every_model_change_has_its_migration() -> None:
    out = StringIO()
    try:
        call_command("makemigrations", "django_dispatch", "--check", "--dry-run", stdout=out)
    except SystemExit as exit:  # --check exits 1 when a migration is missing
        raise AssertionError(
            f"models and migrations differ; run makemigrations:\n{out.getvalue()}"
        ) from exit


ADMIN_LIST_INDEXES = {f"dispatch_job_admin_{name}" for name in ("state", "queue", "task")}


def _job_indexes() -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.get_constraints(cursor, Job._meta.db_table))


@pytest.mark.django_db(transaction=True)
def test_the_admin_list_indexes_are_dropped_and_made_again_backwards() -> None:
    """0034 runs outside a transaction (``DROP INDEX CONCURRENTLY`` on PostgreSQL),
    on SQLite too, and unapplied makes the three indexes again."""
    assert not ADMIN_LIST_INDEXES & _job_indexes()
    executor = MigrationExecutor(connection)
    executor.migrate([("django_dispatch", "0033_map_child_finish")])
    assert _job_indexes() >= ADMIN_LIST_INDEXES
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert not ADMIN_LIST_INDEXES & _job_indexes()
