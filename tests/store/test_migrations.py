"""The models and the migrations agree: a model change without its migration
would ship a schema that users' ``migrate`` never creates."""

import sqlite3
import threading
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


def _function_text(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [name])
        row = cursor.fetchone()
        return row[0] if row else ""


@pytest.mark.django_db(transaction=True)
def test_0038_sets_replace_the_wave_loops_and_unapplied_put_them_back() -> None:
    """The wave's step claims and map children as one statement each; unapplied,
    0035's and 0036's loops again (same signatures: the wave's call works with
    either), and the helper function gone."""
    if connection.vendor != "postgresql":
        pytest.skip("the wave's functions are PostgreSQL's")
    claims, wave = "django_dispatch_wave_step_claims", "django_dispatch_finish_map_wave"
    children = "django_dispatch_map_wave_children"
    assert "FOR i IN" not in _function_text(claims) + _function_text(wave)
    assert "FOR UPDATE OF r" in _function_text(children)
    executor = MigrationExecutor(connection)
    executor.migrate([("django_dispatch", "0037_step_run_indexes")])
    assert "FOR i IN" in _function_text(claims) and "FOR i IN" in _function_text(wave)
    assert _function_text(children) == ""
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert "FOR i IN" not in _function_text(claims) + _function_text(wave)
    assert "FOR UPDATE OF r" in _function_text(children)


STEPS = WorkflowTask._meta.db_table
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


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite rebuilds the step table")
@pytest.mark.django_db(transaction=True)
def test_a_step_written_during_the_step_table_rebuild_is_kept() -> None:
    """0037 rebuilds SQLite's step table (copy, drop, rename) in one transaction:
    a step another connection writes after the copy waits for the rebuild and
    lands in the new table, where outside a transaction it went into the old
    table after the copy and was dropped with it."""
    executor = MigrationExecutor(connection)
    executor.migrate([("django_dispatch", "0036_wave_map_children")])
    run = WorkflowRun.objects.create(name="wf")
    WorkflowTask.objects.create(run=run, name="a", sequence=0, handler_path="x.y")
    writers: list[threading.Thread] = []

    def write_another_step() -> None:
        other = sqlite3.connect(connection.settings_dict["NAME"], timeout=30)
        try:
            columns = [row[1] for row in other.execute(f"PRAGMA table_info({STEPS})")]
            copied = [c for c in columns if c != "id"]
            values = ["'b'" if c == "name" else "1" if c == "sequence" else c for c in copied]
            with other:
                other.execute(
                    f"INSERT INTO {STEPS} ({', '.join(copied)}) "
                    f"SELECT {', '.join(values)} FROM {STEPS} WHERE name = 'a'"
                )
        finally:
            other.close()

    def after_the_copy(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        if sql.startswith(f'INSERT INTO "new__{STEPS}"') and not writers:
            writers.append(threading.Thread(target=write_another_step))
            writers[0].start()
            writers[0].join(1.0)  # done at once unless the rebuild holds the write lock
        return result

    executor.loader.build_graph()
    with connection.execute_wrapper(after_the_copy):
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert writers, "the step table was not rebuilt"
    writers[0].join(30)
    assert sorted(WorkflowTask.objects.values_list("name", flat=True)) == ["a", "b"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent builds: PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_0037_run_again_keeps_the_valid_partial_index() -> None:
    """A run again of 0037 (one interrupted, then ``migrate``) keeps the valid
    partial index it built, where rebuilding it would leave ``child_run_id``
    unindexed meanwhile."""

    def index_oid() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass('dispatch_wftask_child_run')::oid")
            return int(cursor.fetchone()[0])

    built = index_oid()
    with connection.cursor() as cursor:  # interrupted: neither it nor any later one recorded
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = 'django_dispatch' AND name >= %s",
            ["0037_step_run_indexes"],
        )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert index_oid() == built
    assert _step_indexes()[("child_run_id",)] == ["dispatch_wftask_child_run"]
    assert _step_indexes().get(("run_id",)) is None
    assert "dispatch_wfrun_state" not in _run_indexes()
