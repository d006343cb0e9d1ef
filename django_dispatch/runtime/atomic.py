"""Atomic tasks: the body's writes and the job's success commit together, or not at all.

``@task(atomic=True)`` runs its function inside one transaction on the jobs'
database, on the job thread's connection. When the function returns, the
success is written in that same transaction: the fenced UPDATE of the job
(which promotes the next job of its partition, if it has one), and the
attempt's usage record; for an unkeyed job on PostgreSQL they go to the
server with the COMMIT, one round trip, and the transaction's BEGIN goes with
the body's first statement, none (``store.atomic_finish``). If the fence matches no row
(the job was cancelled, timed out or reclaimed meanwhile), everything rolls
back. An exception, a cancel or a timeout leaves the transaction by the
exception first, rolling the body back; the failure is then written as any
other, in its own fenced transaction (retries and dead letters unchanged).
A process recycled or killed mid-body has its connection closed: rolled
back by the database.

Nothing in the transaction writes or locks the job's row before that final
UPDATE: the heartbeat renews the lease, and a leader reclaims an expired one
(``SKIP LOCKED``), while a body runs or hangs. ``progress()`` inside an
atomic task therefore saves no checkpoint (``tasks.context``).

``in_transaction`` is the shape of it, with no job in it (a body and a
fenced success write), which atomic workflow steps use too (``workflows.atomic``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, transaction

from .. import store
from ..conf import usage_recorded
from ..store import atomic_finish
from . import attempt, metering
from .executor import Outcome
from .reporter import report_written, signal_finished
from .running import RunningJob

logger = logging.getLogger("django_dispatch.worker")


class _RollBack(Exception):
    """Leaves the transaction without committing it (never seen outside this module)."""


def in_transaction[T](
    db: str, body: Callable[[], T], settle: Callable[[T], bool]
) -> tuple[T, bool]:
    """Run ``body()``, then ``settle(value)``, in one transaction on ``db``.

    The transaction commits only if ``settle`` returns True (it writes the
    fenced success, and says whether the fence matched); on False it rolls
    back and this returns ``(value, False)``. An exception from either is
    re-raised once the transaction has rolled back. ``settle`` must be the
    first thing in the transaction to write or lock the owner's row (the
    job's, the step's): until then, whoever renews or reclaims it never
    waits for the body. ``settle`` may commit the transaction itself, as its
    last act, when its write won (an atomic job's success and COMMIT go in
    one round trip): the block's own commit then has nothing left to do.
    """
    try:
        with transaction.atomic(using=db), atomic_finish.begin_with_first_statement(db):
            value = body()
            if not settle(value):
                raise _RollBack
    except _RollBack:
        return value, False
    return value, True


def execute(claimed: store.ClaimedJob, running: RunningJob, db: str) -> Outcome:
    """``attempt.execute`` for an atomic task (a sync function: see ``validate_options``).

    A success that this returns is already written, committed with the body
    (``running.persisted`` set, ``running.won`` True), or found lost and
    rolled back (``running.won`` False): never hand it to the completion
    wave, whose later commit would not be the body's. Anything else
    (a failure, a cancel, a timeout) left nothing behind and is written as usual.
    """
    prepared = attempt.prepare(claimed, running)
    if isinstance(prepared, Outcome):
        return prepared
    task, args, kwargs = prepared.task, prepared.args, prepared.kwargs
    concluded: list[Outcome] = []

    def settle(value: object) -> bool:
        outcome = attempt.conclude(claimed, running, prepared, value=value)
        concluded.append(outcome)
        if outcome.kind != "succeeded":  # cancelled meanwhile, or a value that is not JSON
            return False
        # From here on the job waits only for its commit, as a success waits
        # for its wave: its slot counts free for the next claim, and the wait
        # (a WAL flush, which a busy server's disk can stretch past the
        # prefetch's 50 ms) is not taken for a long-running job, which would
        # hand back the jobs claimed ahead and stop claiming ahead for a while.
        running.finished = outcome
        won = write_success(claimed, outcome, db)
        running.persisted, running.won = True, won
        return won

    try:
        in_transaction(db, lambda: task.func(*args, **kwargs), settle)
    except BaseException as e:  # the body, the write or the commit: all rolled back
        running.persisted, running.won, running.finished = False, False, None
        return attempt.conclude(claimed, running, prepared, error=e)
    return concluded[0]


def write_success(claimed: store.ClaimedJob, outcome: Outcome, db: str) -> bool:
    """Inside the body's transaction: the fenced success and, if it won, its usage record.

    An unkeyed job on PostgreSQL sends them with the COMMIT, one round trip
    for the whole success (``store.atomic_finish``), which commits the
    transaction here: the atomic block's own commit then has nothing left to
    do. Otherwise the completion wave's statement for a wave of one (a keyed
    job's partition lock and promotion), committed by the block.
    The meter stops here, so the record measures the body, not the commit.
    """
    meter = metering.METERS.get(claimed.id)
    if meter is not None:
        meter.stop()
    lease = claimed.lease
    key = claimed.row["partition_key"]
    if key and lease.partition_key != key:
        lease = dataclasses.replace(lease, partition_key=key)
    entry = metering.entry(claimed, "succeeded") if usage_recorded("succeeded") else None
    if atomic_finish.fast_path_available(db, lease):
        return atomic_finish.job_commit_success_if_leased(lease, outcome.return_value, entry, db=db)
    usage = {claimed.id: entry} if entry is not None else None
    won = store.jobs_finish_many_if_leased([(lease, outcome.return_value)], db=db, usage=usage)
    return claimed.id in won


def report(running: RunningJob, outcome: Outcome) -> None:
    """After the commit (or the rollback of a lost one): log, count, ``task_finished``.

    A lost success lets go of the job if it was cancelled meanwhile, which
    frees its partition, as the completer does for any lost outcome.
    """
    claimed = running.claimed
    won = bool(running.won)
    if not running.abandoned:  # else whoever abandoned it recorded the outcome
        report_written(claimed, outcome, won)
    if won:
        signal_finished(outcome)
        return
    try:
        store.job_ack_cancelled(claimed.lease, partition_key=claimed.row["partition_key"])
    except (DatabaseError, InterfaceError):  # the lease's expiry lets go of it instead
        logger.warning("job %s: could not let go of it", claimed.id, exc_info=True)
