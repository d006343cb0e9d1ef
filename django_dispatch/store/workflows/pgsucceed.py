"""A step's success on PostgreSQL: the general one in fewer statements, and a
one-step ``ctx.map`` child's in one, then its count.

Every child of a map is a run of (usually) one step, so at thousands of
children a child's own statements are most of what the map costs. The general
success (``succeed``) is ``steps.workflow_step_succeed``'s transaction with
the run's lock and the step's write in one statement (``pgpath``). A one-step
child with nothing to admit (``succeed_map_child``) needs none of what that
transaction is for: no other step of its run can start, and no held sibling
waits for a slot. Its step's success and its run's are one statement in
autocommit (a function call); its count on the waiting step follows, once
that has committed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections
from django.db.models.functions import Now

from ...core.workflow_states import RUN_ACTIVE, STEP_DONE
from ...models import WorkflowRun
from . import pgpath
from .common import StepJobBuilder, advance, count_map_child, write_transaction

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
    """A one-step map child's success in one statement, then its count (the count
    that reaches the set's total gathers). None: not that case (the caller
    takes ``succeed``).

    Only outside a transaction: the count must follow the success's commit.
    A count that fails (a dropped connection, a deadlock while gathering) is
    logged and left to the stale-step sweep, which repairs short counts: the
    child's success is committed, so the job that ran it must not be failed.
    """
    if not connections[db].get_autocommit():
        return None
    done = pgpath.map_child_succeed(db, run_id, step_id, claim_id, output)
    if done is None or not done[3]:
        return None  # the general path decides (a lost fence: it finds it lost)
    parent_step, parent_run, batch, _ = done
    try:
        count_map_child(db, parent_step, batch, parent_run, build_job)
    except Exception:
        logger.exception(
            "counting map child run %s on step %s failed; the stale-step sweep will "
            "repair the count",
            run_id,
            parent_step,
        )
    return True
