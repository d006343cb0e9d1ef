"""A ``ctx.map`` set inserted on PostgreSQL: its first child through the ORM,
every other one copied from it by the database.

At 10,000 children the ORM's per-row work (a model instance, its fields
prepared and sent, for each run, step and job) takes seconds, one worker's
thread held the whole time. Here the first child's run, steps and
first steps' jobs are inserted as anywhere else (``maps._insert_set`` with
one input), so every column gets the value the ORM gives it; then one
``INSERT ... SELECT`` copies the runs for the other children, and one more
their steps and jobs, changing only what differs: a run's input and
position, a step's run and job (a held child's first steps put back to
pending), a job's arguments (its step and generation). Every column of the model is copied
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


def _sequence(model: type[Model]) -> str:
    """The SQL of the sequence behind ``model``'s primary key."""
    return f"pg_get_serial_sequence('{_table(model)}', '{model._meta.pk.column}')::regclass"


def _runs_sql() -> str:
    changed = {"input": "NULLIF(i.value, 'null'::jsonb)", "map_index": "i.n"}
    insert, select = _columns(WorkflowRun, changed, "t")
    return (
        f"INSERT INTO {_table(WorkflowRun)} ({insert}) SELECT {select} "
        f"FROM {_table(WorkflowRun)} AS t, jsonb_array_elements(%(inputs)s::jsonb) "
        "WITH ORDINALITY AS i(value, n) WHERE t.id = %(first)s ORDER BY i.n"
    )


#: The steps of the children at positions 1 .. n - 1, each a copy of the first
#: child's step of the same name, inserted once as it stays: the first child
#: was made ready already (its first steps' jobs inserted, ``enqueue_steps``),
#: so a first step of a child at a position below ``started`` is a copy of a
#: ready step with a job of its own, copied from the first child's job with
#: its step and generation as arguments; a first step of a held child is a
#: copy put back to ``pending``, with no job, as the admission expects it.
#: Each step's id, and its job's, is drawn before either row is written, so
#: that each row is written with the other's id. (A step inserted pending and
#: updated ready once its job existed took a second row version, its index
#: entries written twice, in the one transaction every worker waits for.) The
#: ids come from the primary keys' own sequences, as the ORM's would.
def _steps_and_jobs_sql() -> str:
    steps, runs, jobs = _table(WorkflowTask), _table(WorkflowRun), _table(Job)
    step_ids = _sequence(WorkflowTask)
    job_ids = _sequence(Job)
    held = "t.job_id IS NOT NULL AND src.job_id IS NULL"
    step_insert, step_select = _columns(
        WorkflowTask,
        {
            "run_id": "src.run_id",
            "job_id": "src.job_id",
            "state": f"CASE WHEN {held} THEN 'pending' ELSE t.state END",
            "ready_at": f"CASE WHEN {held} THEN NULL ELSE t.ready_at END",
            "heartbeat_at": f"CASE WHEN {held} THEN NULL ELSE t.heartbeat_at END",
        },
        "t",
    )
    job_insert, job_select = _columns(
        Job, {"args": "jsonb_build_array(src.step_id, t.generation)"}, "tj"
    )
    return (
        "WITH src AS MATERIALIZED (SELECT r.id AS run_id, t.id AS template, "
        f"nextval({step_ids}) AS step_id, "
        "CASE WHEN t.job_id IS NOT NULL AND r.map_index < %(started)s "
        f"THEN nextval({job_ids}) END AS job_id "
        f"FROM {runs} AS r, {steps} AS t "
        "WHERE t.run_id = %(first)s AND r.map_batch = %(batch)s AND r.map_index > 0 "
        "ORDER BY r.map_index, t.sequence), "
        f"inserted AS (INSERT INTO {steps} (id, {step_insert}) "
        f"SELECT src.step_id, {step_select} "
        f"FROM src JOIN {steps} AS t ON t.id = src.template ORDER BY src.step_id) "
        f"INSERT INTO {jobs} (id, {job_insert}) SELECT src.job_id, {job_select} "
        f"FROM src JOIN {steps} AS t ON t.id = src.template JOIN {jobs} AS tj ON tj.id = t.job_id "
        "WHERE src.job_id IS NOT NULL ORDER BY src.job_id"
    )


#: The steps of the children at positions 1 .. n - 1 of a batched set
#: (``mapbatch``: one-step children, all admitted), each a copy of the first
#: child's step entrusted to the job of its batch, the children at positions
#: 1 + k * size .. (k + 1) * size; and those jobs, copies of the first child's
#: job as the batch task with the batch's ``[step_id, generation]`` pairs. The
#: first child keeps its own job. Ids drawn first, as above.
def _batched_steps_and_jobs_sql() -> str:
    steps, runs, jobs = _table(WorkflowTask), _table(WorkflowRun), _table(Job)
    step_insert, step_select = _columns(
        WorkflowTask, {"run_id": "src.run_id", "job_id": "b.job_id"}, "t"
    )
    job_insert, job_select = _columns(Job, {"args": "b.args", "task_path": "%(task)s"}, "tj")
    return (
        "WITH src AS MATERIALIZED (SELECT r.id AS run_id, t.id AS template, "
        f"nextval({_sequence(WorkflowTask)}) AS step_id, t.generation, "
        "(r.map_index - 1) / %(size)s AS part "
        f"FROM {runs} AS r, {steps} AS t "
        "WHERE t.run_id = %(first)s AND r.map_batch = %(batch)s AND r.map_index > 0 "
        "ORDER BY r.map_index), "
        "parts AS MATERIALIZED (SELECT part, jsonb_build_array(jsonb_agg("
        "jsonb_build_array(step_id, generation) "
        "ORDER BY step_id)) AS args FROM src GROUP BY part), "
        f"b AS MATERIALIZED (SELECT part, args, nextval({_sequence(Job)}) AS job_id "
        "FROM (SELECT * FROM parts ORDER BY part) AS p), "
        f"inserted AS (INSERT INTO {steps} (id, {step_insert}) "
        f"SELECT src.step_id, {step_select} FROM src JOIN b ON b.part = src.part "
        f"JOIN {steps} AS t ON t.id = src.template ORDER BY src.step_id) "
        f"INSERT INTO {jobs} (id, {job_insert}) SELECT b.job_id, {job_select} "
        f"FROM b, {steps} AS t JOIN {jobs} AS tj ON tj.id = t.job_id "
        "WHERE t.run_id = %(first)s ORDER BY b.job_id"
    )


_RUNS_SQL = _runs_sql()
_STEPS_AND_JOBS_SQL = _steps_and_jobs_sql()
_BATCHED_STEPS_AND_JOBS_SQL = _batched_steps_and_jobs_sql()


def copy_children(
    db: str,
    first_id: int,
    batch: str,
    inputs: Sequence[Any],
    started: int,
    *,
    size: int = 1,
    task: str = "",
) -> None:
    """Insert the runs of set ``batch`` at positions 1 .. len(inputs) - 1, copies
    of the first's (``first_id``, inserted with its steps and made ready), their
    steps, and the jobs of the first steps of those below ``started``: one
    each, or, with ``size`` > 1 (every child admitted, one step each), one job
    of ``task`` per ``size`` children. In the caller's transaction."""
    if len(inputs) < 2:
        return
    connection = connections[db]
    field = WorkflowRun._meta.get_field("input")
    params = {
        "inputs": field.get_db_prep_save(list(inputs[1:]), connection),
        "first": first_id,
        "batch": batch,
        "started": started,
        "size": size,
        "task": task,
    }
    with connection.cursor() as cursor:
        cursor.execute(_RUNS_SQL, params)
        cursor.execute(_BATCHED_STEPS_AND_JOBS_SQL if size > 1 else _STEPS_AND_JOBS_SQL, params)
