"""A step attempt's own writes on PostgreSQL, in as few statements as they allow.

Every child run of a ``ctx.map`` is a run with (usually) one step, so each
child pays a step's claim and its success; at thousands of children these
statements are most of what the map costs. Here each is one statement where
the ORM path (used on SQLite, and kept as the reference) takes two or three,
and is written out once, not built by the ORM per call:

- the claim of a ready step, and the read of what its attempt needs of the
  step and its run: one ``UPDATE ... FROM ... RETURNING``, in a function of
  migration 0024 so that it is planned once per server session (``claim_ready``);
- the success's opening: the run's lock and the fenced write of the step, one
  statement whose CTEs run in that order, because the second reads the first
  (``lock_and_succeed``); then the read of the run's steps for ``advance``
  (``run_steps``, written out rather than built by the ORM);
- a map child's run success, and the read of its set's admission counters
  (``map_child_done``); after its commit, its count (``count_child``);
- the success of a one-step map child with nothing to admit, its step's and
  its run's, and its count on the parent step: one call of a function of
  migration 0033 (``map_child_finish``), whose commit does not wait for the
  WAL flush (the step job's own success, written after it, flushes it).

The transitions, their fences and their lock order are the ORM path's,
statement for statement; only the round trips are fewer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connections

from ...core.workflow_states import RunState, StepState
from ...models import WorkflowRun, WorkflowTask

_STEPS = WorkflowTask._meta.db_table
_RUNS = WorkflowRun._meta.db_table

#: What an attempt reads of its step and of its run (``steps.ClaimedStep``).
STEP_FIELDS = (
    "run_id", "name", "handler_path", "generation", "attempts", "failures", "max_attempts",
    "backoff", "timeout", "checkpoint", "depends_on", "waits",
)  # fmt: skip
RUN_FIELDS = ("name", "input", "queue_name", "call_context", "map_batch")

#: The claim of a ready step and the read of its attempt's fields: the
#: function of migration 0024 (an ``UPDATE ... FROM ... RETURNING``), planned
#: once per server session; sent as a statement, its planning cost the server
#: about as much as its execution, at every claim.
#: With ``p_lazy`` (migration 0033), in autocommit only: the claim's commit does
#: not wait for the WAL flush. Anything durable the attempt writes afterwards
#: (its outcome, its job's success) is later in the WAL and flushes it first;
#: a claim lost to a server crash leaves the step ready for its job, which the
#: crash left unfinished too, and whose re-run claims the step again.
_CLAIM_READY_SQL = "SELECT * FROM django_dispatch_step_claim_ready(%s, %s, %s, %s, %s)"

#: The run's lock, then the step's fenced success (``s`` reads ``r``, so the
#: run row is locked first, as everywhere else). The lock is a ``FOR
#: UPDATE``, not ``lock_run``'s UPDATE: the run row is written once, by
#: whatever the success changes on it (a map child's: its own success), not
#: twice (each write of the run is a new row version with an entry in each of
#: its indexes, and a row written twice in one transaction has its foreign
#: keys checked again); the caller touches ``updated_at`` when nothing else
#: does. The run's steps are NOT read here: this statement's snapshot predates
#: the wait for the lock, so it would miss what the lock's previous holder
#: committed (a sibling branch's success, and the fan-in would never start);
#: ``run_steps`` reads them in a statement of its own, after the lock.
_LOCK_AND_SUCCEED_SQL = (
    "WITH r AS (SELECT id, name, state, generation, queue_name, parent_task_id, "
    f"parent_run_id, namespace, map_batch FROM {_RUNS} WHERE id = %s FOR UPDATE), "
    f"s AS (UPDATE {_STEPS} SET state = %s, output = %s, claim_id = NULL, "
    "finished_at = statement_timestamp(), updated_at = statement_timestamp() "
    "WHERE id = %s AND claim_id = %s AND state = %s AND run_id IN (SELECT id FROM r) "
    "RETURNING id) "
    "SELECT r.*, EXISTS (SELECT 1 FROM s) FROM r"
)
_RUN_STEPS_SQL = (
    f"SELECT id, name, state, depends_on, generation, output FROM {_STEPS} "
    "WHERE run_id = %s ORDER BY sequence"
)
_LOCKED_RUN_FIELDS = (
    "id", "name", "state", "generation", "queue_name", "parent_task_id", "parent_run_id",
    "namespace", "map_batch",
)  # fmt: skip
_STEP_KEYS = ("id", "name", "state", "depends_on", "generation", "output")

#: A map child's first success (``map_counted`` still false), and its set's
#: admission counters on the parent step while that still waits for the set.
_MAP_CHILD_DONE_SQL = (
    f"UPDATE {_RUNS} SET state = %s, output = %s, finished_at = statement_timestamp(), "
    "updated_at = statement_timestamp(), map_counted = true "
    "WHERE id = %s AND NOT map_counted RETURNING "
    f"(SELECT map_started FROM {_STEPS} WHERE id = %s AND state = %s AND map_batch = %s), "
    f"(SELECT map_total FROM {_STEPS} WHERE id = %s AND state = %s AND map_batch = %s)"
)


#: A map child counted on its parent step, after its success committed
#: (``common.count_map_child``): the function of migration 0031, planned once
#: per server session (sent as a statement, its planning cost the server about
#: as much as its execution, at every child). Every child of a set writes this
#: one row, so the row lock must be held as briefly as possible:
#: - it sets ``map_done`` and ``updated_at`` only, no indexed column (not
#:   ``heartbeat_at``: ``dispatch_wftask_live`` indexes it), so the update is
#:   HOT: no new index entry per count, and the 10,000th count finds the row
#:   as fast as the first (with a new index entry each, the step's index
#:   entries piled up and every count walked more of them);
#: - its commit does not wait for the WAL flush (``synchronous_commit`` off
#:   for the call's own transaction only), so the lock is not held across an
#:   fsync, which made the children count one fsync at a time. What that
#:   risks is losing the count, never the child's success (committed and
#:   flushed before): a server crash in the next moments leaves the count
#:   short, which the sweep repairs, as it repairs a count lost to a worker
#:   dying between the commit and this.
_COUNT_SQL = "SELECT done, total FROM django_dispatch_map_count(%s, %s)"
#: The same for the children one wave wrote (``mapwave``), all at once: the
#: function of migration 0036.
_COUNT_MANY_SQL = "SELECT done, total FROM django_dispatch_map_count_many(%s, %s, %s)"


#: A one-step map child's success and its count on the parent step, in
#: autocommit (``pgsucceed``): the function of migration 0033, planned once per
#: server session. Its commit does not wait for the WAL flush, so the parent
#: step's row, which every child of the set writes, is not locked across an
#: fsync (as for ``_COUNT_SQL``); the child's success is made durable by the
#: step job's own success, committed after it and waiting for its flush (WAL
#: is flushed in order), and a crash that loses it loses that job's success
#: too, whose re-run runs the child's step again.
_MAP_CHILD_FINISH_SQL = (
    "SELECT parent_step, parent_run, batch, written, done, total "
    "FROM django_dispatch_map_child_finish(%s, %s, %s, %s)"
)


def applies(db: str) -> bool:
    """Whether these statements serve ``db`` (PostgreSQL; SQLite takes the ORM path)."""
    return connections[db].vendor == "postgresql"


def _json(value: Any) -> Any:
    """A jsonb column as the ORM reads it: Django has psycopg 3 load jsonb as text,
    which its JSONField decodes (these fields have no decoder of their own)."""
    return json.loads(value) if isinstance(value, str) else value


def _json_param(db: str, value: Any) -> Any:
    """A Python value as the ORM writes it to a jsonb column (None: SQL NULL)."""
    return WorkflowTask._meta.get_field("output").get_db_prep_save(value, connections[db])


def claim_ready(
    db: str, step_id: int, generation: int, job_id: int, claim_id: str
) -> dict[str, Any] | None:
    """ready -> running with ``claim_id`` for the job entrusted with the step; the
    step's and its run's fields (the run's prefixed ``run__``), or None."""
    with connections[db].cursor() as cursor:
        lazy = connections[db].get_autocommit()  # else it would set the caller's transaction's
        cursor.execute(_CLAIM_READY_SQL, [step_id, generation, job_id, claim_id, lazy])
        row = cursor.fetchone()
    if row is None:
        return None
    return claimed_fields(row)


def claimed_fields(row: Sequence[Any]) -> dict[str, Any]:
    """A step claim's ``STEP_FIELDS`` and ``RUN_FIELDS`` (prefixed ``run__``), as the
    ORM reads them, from the claim function's row (0033's, or 0035's past its
    job, step and claim ids)."""
    step = dict(zip(STEP_FIELDS, row[: len(STEP_FIELDS)], strict=True))
    for name in ("backoff", "checkpoint", "depends_on", "waits"):
        step[name] = _json(step[name])
    for name, value in zip(RUN_FIELDS, row[len(STEP_FIELDS) :], strict=True):
        step[f"run__{name}"] = _json(value) if name in ("input", "call_context") else value
    return step


def lock_and_succeed(
    db: str, run_id: int, step_id: int, claim_id: str, output: Any
) -> tuple[dict[str, Any] | None, bool]:
    """In the caller's transaction: lock the run, running -> succeeded for this claim.

    Returns the run's fields (None: no such run) and whether the fence matched.
    """
    with connections[db].cursor() as cursor:
        cursor.execute(
            _LOCK_AND_SUCCEED_SQL,
            [
                run_id, StepState.SUCCEEDED, _json_param(db, output), step_id, claim_id,
                StepState.RUNNING,
            ],
        )  # fmt: skip
        row = cursor.fetchone()
    if row is None:
        return None, False
    width = len(_LOCKED_RUN_FIELDS)
    return dict(zip(_LOCKED_RUN_FIELDS, row[:width], strict=True)), bool(row[width])


def run_steps(db: str, run_id: int) -> list[dict[str, Any]]:
    """The run's steps in definition order, as ``common.advance`` reads them."""
    with connections[db].cursor() as cursor:
        cursor.execute(_RUN_STEPS_SQL, [run_id])
        rows = cursor.fetchall()
    steps = [dict(zip(_STEP_KEYS, row, strict=True)) for row in rows]
    for step in steps:
        step["depends_on"] = _json(step["depends_on"])
        step["output"] = _json(step["output"])
    return steps


def map_child_done(
    db: str, run_id: int, output: Any, step_id: int, batch: str
) -> tuple[bool, Sequence[int | None]]:
    """running -> succeeded for a map child, counted once: (first success?, the
    parent step's (map_started, map_total) while it waits for ``batch``)."""
    waiting: list[Any] = [step_id, StepState.WAITING, batch]
    with connections[db].cursor() as cursor:
        cursor.execute(
            _MAP_CHILD_DONE_SQL,
            [RunState.SUCCEEDED, _json_param(db, output), run_id, *waiting, *waiting],
        )
        row = cursor.fetchone()
    if row is None:
        return False, (None, None)
    return True, (row[0], row[1])


def count_child(db: str, step_id: int, batch: str) -> tuple[int, int | None] | None:
    """map_done + 1 on the step still waiting for ``batch``, in autocommit: (done,
    total), or None."""
    with connections[db].cursor() as cursor:
        cursor.execute(_COUNT_SQL, [step_id, batch])
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def count_many(db: str, step_id: int, batch: str, n: int) -> tuple[int, int | None] | None:
    """map_done + ``n`` on the step still waiting for ``batch``, in autocommit:
    (done, total), or None."""
    with connections[db].cursor() as cursor:
        cursor.execute(_COUNT_MANY_SQL, [step_id, batch, n])
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def map_child_finish(
    db: str, run_id: int, step_id: int, claim_id: str, output: Any
) -> tuple[int, int, str, bool, int | None, int | None] | None:
    """A one-step map child's success, its run's and its count, in autocommit.

    None: the run is not a running, uncounted map child. Else (parent step,
    parent run, set, written?, done, total); not written: the fence did not
    match, the run has other steps, or the set has children to admit (the
    caller then takes the general path, which decides); done and total None
    when the parent step no longer waits for the set.
    """
    with connections[db].cursor() as cursor:
        cursor.execute(_MAP_CHILD_FINISH_SQL, [run_id, step_id, claim_id, _json_param(db, output)])
        row = cursor.fetchone()
    if row is None:
        return None
    return row[0], row[1], row[2], bool(row[3]), row[4], row[5]
