"""A step's success on PostgreSQL: the general one in fewer statements, and a
one-step ``ctx.map`` child's, with its count, in one.

Every child of a map is a run of (usually) one step, so at thousands of
children a child's own statements are most of what the map costs. The general
success (``succeed``) is ``steps.workflow_step_succeed``'s transaction with
the run's lock and the step's write in one statement (``pgpath``). A one-step
child with nothing to admit (``succeed_map_child``) needs none of what that
transaction is for: no other step of its run can start, and no held sibling
waits for a slot. Its step's success, its run's and its count on the waiting
step are one statement in autocommit (a function call, ``pgpath.map_child_finish``);
the count that reaches the total then gathers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import DatabaseError, connections
from django.db.models.functions import Now

from ...core.workflow_states import RUN_ACTIVE, STEP_DONE
from ...models import WorkflowRun
from . import mapwave, pgpath
from .common import StepJobBuilder, advance, gather, write_transaction

logger = logging.getLogger("django_dispatch.store")


def succeed(
    db: str, run_id: int, step_id: int, claim_id: str, output: Any, build_job: StepJobBuilder
) -> bool:
    """``workflow_step_succeed`` on PostgreSQL: the same transaction, fewer statements."""
    with write_transaction(db):
        run, won = pgpath.lock_and_succeed(db, run_id, step_id, claim_id, output)
        if run is None:
            return False
        steps = pgpath.run_steps(db, run_id) if won else []
        if won:
            advance(db, run, build_job, steps=steps)
        if not won or run["state"] not in RUN_ACTIVE or not _all_done(steps):
            # The run locked and not written by its success (which a
            # finished run's is): a transition still shows on it.
            WorkflowRun.objects.using(db).filter(id=run_id).update(updated_at=Now())
    return won


def _all_done(steps: Sequence[Mapping[str, Any]]) -> bool:
    return bool(steps) and all(step["state"] in STEP_DONE for step in steps)


def succeed_map_child(
    db: str, run_id: int, step_id: int, claim_id: str, output: Any, build_job: StepJobBuilder
) -> bool | None:
    """A one-step map child's success and its count in one statement (the count
    that reaches the set's total gathers). None: not that case (the caller
    takes ``succeed``).

    Only outside a transaction: the statement's commit must not wait for the
    WAL flush, which it may only choose for a transaction of its own, and the
    gather must follow it. If the statement fails, nothing of it committed,
    and the general path takes over. A gather that fails (a dropped connection, a
    deadlock) is logged and left to the stale-step sweep (``gather_stalled``),
    which gathers a set whose children are all counted: the child's success is
    committed, so the job that ran it must not be failed.
    """
    if not connections[db].get_autocommit():
        return None
    try:
        done = pgpath.map_child_finish(db, run_id, step_id, claim_id, output)
    except DatabaseError:
        # Nothing of it committed (e.g. the waiting step's row lock timed out):
        # the general path writes the success, and counts after its commit.
        logger.warning("map child run %s: its one-statement success failed", run_id, exc_info=True)
        return None
    if done is None or not done[3]:
        return None  # the general path decides (a lost fence: it finds it lost)
    parent_step, parent_run, batch, _, counted, total = done
    mapwave.learn(db, batch)  # its siblings may leave their successes to their waves
    if counted is None or counted < (total or 0):
        return True
    try:
        gather(db, parent_step, batch, parent_run, build_job)
    except Exception:
        logger.exception(
            "gathering map step %s after its last child run %s failed; the stale-step "
            "sweep will gather it",
            parent_step,
            run_id,
        )
    return True
