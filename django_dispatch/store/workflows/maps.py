"""``ctx.map``: a step that waits for one child run per input.

The start (``workflow_step_map``) is one transaction under the step's claim:
the step goes ``running -> waiting`` with a fresh *set* id (``map_batch``)
and its counters, and every child run is inserted, each with the set id and
its input's position (``map_index``). The first ``max_parallel`` children
(all of them, without a bound) get the jobs of their first steps; the others
are *held*: inserted as running, their steps pending with no job, so no
worker can take them.

The rest happens as the children succeed (``common``). A child's success
admits the next held child (``map_started``), under the parent run's lock,
so at most ``max_parallel`` children are ever runnable at once, across the
cluster, whatever the number of workers; once every child is admitted, a
success no longer touches the parent in its transaction. Each success is
then counted on the step (``map_done``) by one statement after its commit;
the count that reaches the total gathers the outputs in input order, after
checking every child itself, and moves the parent run on. So children
finish side by side, not one parent-lock at a time. A
cancelled child fails the step, parks the run, and cancels the set's other
unfinished children. A step reset by a replay, a retry or a skip, or a
cancelled run, cancels its set's unfinished children; the finished ones stay,
as the history of that attempt, and a replayed step starts a fresh set.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from typing import Any

from django.db.models.functions import Now

from ...core.workflow_states import RunState, StepState
from ...models import WorkflowRun, WorkflowTask
from . import mapbatch, pgmapset, pgpath
from .common import RunSpec, StepJobBuilder, advance, claim_fence, db_or_default, locked_run
from .runs import step_rows
from .stepjobs import BATCH_TASK, enqueue_steps

#: Rows per INSERT when a set is inserted (SQLite allows 32,766 parameters).
MAP_INSERT_BATCH = 500


def workflow_step_map(
    step_id: int,
    claim_id: str,
    child: RunSpec,
    inputs: Sequence[Any],
    max_parallel: int | None,
    *,
    build_job: StepJobBuilder,
    db: str | None = None,
) -> bool:
    """running -> waiting for one child run of ``child`` per input (its ``input``
    unused); with no input, running -> succeeded with ``[]``. False: claim lost.

    The step and its children commit together, so an attempt that lost its
    claim starts no child, and one attempt never starts two sets.
    """
    db = db_or_default(db)
    with locked_run(db, step_id=step_id) as run:
        if run is None:
            return False
        fence = claim_fence(db, step_id, claim_id)
        if not inputs:
            if not fence.update(
                state=StepState.SUCCEEDED,
                output=[],
                claim_id=None,
                finished_at=Now(),
                updated_at=Now(),
            ):
                return False
            advance(db, run, build_job)
            return True
        batch = secrets.token_hex(16)
        started = len(inputs) if max_parallel is None else min(max_parallel, len(inputs))
        if not fence.update(
            state=StepState.WAITING,
            claim_id=None,
            map_batch=batch,
            map_total=len(inputs),
            map_started=started,
            map_done=0,
            map_max_parallel=max_parallel,
            heartbeat_at=Now(),
            updated_at=Now(),
        ):
            return False
        child = dataclasses.replace(child, namespace=run["namespace"])  # the parent's
        parent = (run["id"], step_id)
        _insert_set(db, child, inputs, parent, (batch, started, max_parallel), build_job)
    return True


def _insert_set(
    db: str,
    spec: RunSpec,
    inputs: Sequence[Any],
    parent: tuple[int, int],
    admitted: tuple[str, int, int | None],
    build_job: StepJobBuilder,
) -> None:
    """Insert the set's runs and steps in bulk; the first ``started`` runs get jobs.

    ``admitted``: the set's id, how many children start now, and its bound.
    On PostgreSQL only the first child goes through the ORM; the others are
    copied from it by the database (``pgmapset``), in batches where they can
    be (``mapbatch``).
    """
    batch, started, max_parallel = admitted
    copied = pgpath.applies(db)
    runs = WorkflowRun.objects.using(db).bulk_create(
        [
            WorkflowRun(
                namespace=spec.namespace,
                name=spec.name,
                state=RunState.RUNNING,
                input=value,
                queue_name=spec.queue_name,
                call_context=spec.call_context,
                parent_run_id=parent[0],
                parent_task_id=parent[1],
                map_batch=batch,
                map_index=index,
            )
            for index, value in enumerate(inputs[:1] if copied else inputs)
        ],
        batch_size=MAP_INSERT_BATCH,
    )
    rows = [row for run in runs for row in step_rows(run, spec)]
    rows = WorkflowTask.objects.using(db).bulk_create(rows, batch_size=MAP_INSERT_BATCH)
    first = [row for row in rows[: started * len(spec.steps)] if not row.depends_on]
    routes = {row.pk: (row.queue_name, row.priority) for row in first}
    queue = {"queue_name": spec.queue_name, "namespace": spec.namespace}
    enqueue_steps(db, queue, [(r.pk, r.generation) for r in first], build_job, routes=routes)
    if copied:  # the first child as it stays: ready, its first steps' jobs inserted
        size = mapbatch.size_for(db, spec, len(inputs), max_parallel)
        task = BATCH_TASK
        pgmapset.copy_children(db, runs[0].pk, batch, inputs, started, size=size, task=task)
