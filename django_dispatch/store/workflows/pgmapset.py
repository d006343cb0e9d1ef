"""A ``ctx.map`` set inserted on PostgreSQL: its first child through the ORM,
every other one copied from it by the database.

At 10,000 children the ORM's per-row work (a model instance, its fields
prepared and sent, for each run, step and job) takes seconds, one worker's
thread held the whole time. Here the first child's run, steps and
first steps' jobs are inserted as anywhere else (``maps._insert_set`` with
one input), so every column gets the value the ORM gives it; then one
``INSERT ... SELECT`` per table copies them for the other children, changing
only what differs: a run's input and position, a step's run, a job's
arguments (its step and generation). Every column of the model is copied
(the lists are the models' own), so a column added later is copied too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.models import Model

from ...models import Job, WorkflowRun, WorkflowTask


def _columns(model: type[Model], changed: dict[str, str], source: str) -> tuple[str, str]:
    """(the INSERT's column list, the SELECT's values): every column but the
    primary key, from ``source``'s row unless ``changed`` gives its SQL."""
    names = [str(f.column) for f in model._meta.concrete_fields if not f.primary_key]
    insert = ", ".join(f'"{name}"' for name in names)
    select = ", ".join(changed.get(name, f'{source}."{name}"') for name in names)
    return insert, select


def _table(model: type[Model]) -> str:
    return f'"{model._meta.db_table}"'


def _runs_sql() -> str:
    changed = {"input": "NULLIF(i.value, 'null'::jsonb)", "map_index": "i.n"}
    insert, select = _columns(WorkflowRun, changed, "t")
    return (
        f"INSERT INTO {_table(WorkflowRun)} ({insert}) SELECT {select} "
        f"FROM {_table(WorkflowRun)} AS t, jsonb_array_elements(%(inputs)s::jsonb) "
        "WITH ORDINALITY AS i(value, n) WHERE t.id = %(first)s ORDER BY i.n"
    )


def _steps_sql() -> str:
    insert, select = _columns(WorkflowTask, {"run_id": "r.id"}, "t")
    return (
        f"INSERT INTO {_table(WorkflowTask)} ({insert}) SELECT {select} "
        f"FROM {_table(WorkflowTask)} AS t, {_table(WorkflowRun)} AS r "
        "WHERE t.run_id = %(first)s AND r.map_batch = %(batch)s AND r.map_index > 0 "
        "ORDER BY r.map_index, t.sequence"
    )


#: The jobs of the first steps of the children at positions 1 .. started - 1,
#: each a copy of the first child's job for the step of the same name, and the
#: steps made ready with them (as ``enqueue_steps`` made the first child's).
def _jobs_sql() -> str:
    args = "jsonb_build_array(s.id, s.generation)"
    insert, select = _columns(Job, {"args": args}, "tj")
    steps, runs, jobs = _table(WorkflowTask), _table(WorkflowRun), _table(Job)
    return (
        f"WITH j AS (INSERT INTO {jobs} ({insert}) SELECT {select} "
        f"FROM {runs} AS r JOIN {steps} AS s ON s.run_id = r.id "
        f"JOIN {steps} AS t ON t.run_id = %(first)s AND t.name = s.name "
        f"JOIN {jobs} AS tj ON tj.id = t.job_id "
        "WHERE r.map_batch = %(batch)s AND r.map_index > 0 AND r.map_index < %(started)s "
        "ORDER BY r.map_index, s.sequence RETURNING id, args) "
        f"UPDATE {steps} AS s SET job_id = j.id, state = t.state, claim_id = NULL, "
        "ready_at = t.ready_at, heartbeat_at = t.heartbeat_at, finished_at = NULL, "
        f"updated_at = t.updated_at FROM j, {steps} AS t "
        "WHERE s.id = (j.args ->> 0)::bigint AND t.run_id = %(first)s AND t.name = s.name"
    )


_RUNS_SQL = _runs_sql()
_STEPS_SQL = _steps_sql()
_JOBS_SQL = _jobs_sql()


def copy_runs(db: str, first_id: int, batch: str, inputs: Sequence[Any]) -> None:
    """Insert the runs and steps of set ``batch`` at positions 1 .. len(inputs) - 1,
    copies of the first's (``first_id``, inserted with its steps, no job yet).
    In the caller's transaction."""
    if len(inputs) < 2:
        return
    connection = connections[db]
    field = WorkflowRun._meta.get_field("input")
    params = {
        "inputs": field.get_db_prep_save(list(inputs[1:]), connection),
        "first": first_id,
        "batch": batch,
    }
    with connection.cursor() as cursor:
        cursor.execute(_RUNS_SQL, params)
        cursor.execute(_STEPS_SQL, params)


def copy_jobs(db: str, first_id: int, batch: str, started: int) -> None:
    """The first steps of the children at positions 1 .. started - 1 get jobs,
    copies of the first child's (made ready with its jobs already)."""
    if started < 2:
        return
    with connections[db].cursor() as cursor:
        cursor.execute(_JOBS_SQL, {"first": first_id, "batch": batch, "started": started})
