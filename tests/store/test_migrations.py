"""The models and the migrations agree: a model change without its migration
would ship a schema that users' ``migrate`` never creates."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from django_dispatch.models import Job, WorkflowRun, WorkflowTask


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


def _run_indexes() -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.get_constraints(cursor, WorkflowRun._meta.db_table))


def _step_indexes() -> dict[tuple[str, ...], list[str]]:
    """The step table's indexes that are not unique, by their columns."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, WorkflowTask._meta.db_table)
    indexes: dict[tuple[str, ...], list[str]] = {}
    for name, info in found.items():
        if info["index"] and not info["unique"] and not info["primary_key"]:
            indexes.setdefault(tuple(info["columns"]), []).append(name)
    return indexes


@pytest.mark.django_db(transaction=True)
def test_the_step_and_run_indexes_are_dropped_and_made_again_backwards() -> None:
    """0037 leaves ``run_id`` to the unique (run, name) and (run, sequence)
    indexes, ``child_run_id`` to its partial index, and drops the runs'
    (namespace, state, updated_at); unapplied, it makes the three again."""
    assert "dispatch_wfrun_state" not in _run_indexes()
    assert _step_indexes().get(("run_id",)) is None
    assert _step_indexes()[("child_run_id",)] == ["dispatch_wftask_child_run"]
    executor = MigrationExecutor(connection)
    executor.migrate([("django_dispatch", "0036_wave_map_children")])
    assert len(_step_indexes()[("run_id",)]) == 1
    assert len(_step_indexes()[("child_run_id",)]) == 1
    assert "dispatch_wftask_child_run" not in _step_indexes()[("child_run_id",)]
    assert "dispatch_wfrun_state" in _run_indexes()
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert "dispatch_wfrun_state" not in _run_indexes()
    assert _step_indexes().get(("run_id",)) is None
    assert _step_indexes()[("child_run_id",)] == ["dispatch_wftask_child_run"]
