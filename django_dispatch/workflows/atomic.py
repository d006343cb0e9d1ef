"""Atomic steps: the step's writes, its outcome and the run's advance commit together.

``@wf.step(atomic=True)`` runs the step function inside one transaction on
the jobs' database, on the thread that runs it (``runtime.atomic.in_transaction``).
When it returns, its outcome is classified and, if it is one that ends the
attempt for good (an output, ``ctx.start_child``, ``ctx.map``), written in
that same transaction through the step's claim fence: the step's move,
the dependents' jobs, the run's end, the child runs. If the claim no longer
holds (the run was cancelled or reopened, the step skipped or swept, or the
step job's worker was lost and the job's re-run took the step over), the
whole transaction rolls back: a frozen or killed attempt leaves no write.

Everything else leaves the transaction first, rolling the body back, and is
written as for any step, in its own transaction: an exception or a timeout
(a failed attempt, retried as usual), a durable wait (the step runs again
from the top when the wait ends, and its writes then commit with its
outcome), an output that is not JSON. A process killed mid-body has its
connection closed: rolled back by the database.

Nothing in the transaction writes or locks the step's row before that final
write (``progress()`` only reads the claim, artifacts are refused), so the
step job's heartbeat, the reclaim and the next claim of the step never wait
for a body that hangs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runtime.atomic import in_transaction
from ..store.base import db_alias
from .context import StepContext
from .runner import StepOutcome, classify

#: Outcomes written in the body's transaction; any other rolls the body back.
WRITTEN_WITH_BODY = frozenset({"succeeded", "child", "map"})


def atomic_body(
    func: Callable[[StepContext], Any],
    timeout: float | None,
    write: Callable[[StepOutcome], bool],
) -> Callable[[StepContext], StepOutcome]:
    """``func`` wrapped to run, and have its outcome written by ``write``, in one transaction.

    The wrapper returns the classified outcome, its ``recorded`` set when
    it was written (True: committed; False: the claim was lost, rolled
    back). It runs wherever ``run_attempt`` calls the step function (the
    job's thread, or the helper thread of a timed ``drain()``): the
    transaction is on that thread's connection, as the body's writes are.
    """

    def body(ctx: StepContext) -> StepOutcome:
        settled: list[StepOutcome] = []

        def settle(value: Any) -> bool:
            outcome = classify(value, ctx, timeout)
            settled.append(outcome)
            if outcome.kind not in WRITTEN_WITH_BODY:
                return False  # rolled back; written afterwards, on its own
            outcome.recorded = write(outcome)
            return outcome.recorded

        in_transaction(db_alias(), lambda: func(ctx), settle)
        return settled[0]

    return body
