"""``run_now(result_id)``: claim one job by id and run it in the caller's process, now.

The claim is ``store.claim_by_id``'s (a worker's claim of that row: its
partition, limits and pauses apply; its ``run_after`` does not), and the job
runs through the worker's own machinery as ``workflows.run_now``'s steps do
(``inline``: the job thread and ``JobRunner``, the completer's fenced writes,
the heartbeat renewing the lease, timeouts), under a short-lived worker id
``run_now:<host>:<pid>:<random>``. Retries, dead letters, usage records and
the workflow advancement of a step job are therefore a worker's.

A worker racing the call for the same job cannot also run it: both claims
lock the row with SKIP LOCKED and lease it only while it is pending, so the
loser finds it locked or running and moves on.
"""

from __future__ import annotations

from dataclasses import replace

from django.db import connections
from django.db.transaction import TransactionManagementError

from .. import store
from ..compat import TaskResultDoesNotExist
from ..conf import get_settings
from ..store.claim_by_id import job_claim_by_id, job_namespace
from ..tasks.registry import namespace_for
from .inline import inline_worker_id, run_claimed


def run_now(result_id: str | int, *, backend: str = "default") -> bool:
    """Claim the job ``result_id`` (``TaskResult.id``) and run it here; True if it ran.

    It returns once the attempt's outcome is committed: succeeded, failed
    (a retry scheduled, or failed for good with its dead letter), or parked
    by a workflow step's durable wait. Its result is read as usual
    (``task.get_result(result_id)``).

    False, with nothing run, when the job is not claimable now: running
    (on a worker or another ``run_now``), finished or cancelled, held behind
    its partition's head, over its task's or queue's concurrency or rate
    limit, or in a paused queue. A job deferred to later (``run_after``, or a
    retry's backoff) is run now: that is what the call asks. A job with
    resource needs or a locality runs here too: those choose among workers,
    and this caller named the job itself.

    ``backend``: the TASKS alias whose namespace and database hold the job.

    Raises, with nothing written: ``TypeError`` or ``ValueError`` for an id
    that is not a job's, ``TaskResultDoesNotExist`` for an unknown job,
    ``ValueError`` for a job of another alias's namespace or an alias that
    is not a DispatchBackend, and ``TransactionManagementError`` inside
    ``transaction.atomic()`` (see the message).
    """
    job_id = _job_id(result_id)
    namespace = namespace_for(backend)  # an unknown alias: ValueError
    with store.using_backend(backend) as db:  # the worker's threads carry it too
        return _run_now(job_id, namespace, backend, db)


def _run_now(job_id: int, namespace: str, backend: str, db: str) -> bool:
    if connections[db].in_atomic_block:
        raise TransactionManagementError(
            "run_now() cannot run inside transaction.atomic() (or ATOMIC_REQUESTS): it commits "
            "the job's claim and outcome itself, and runs the job on a thread with its own "
            "connection, which cannot see uncommitted rows. Call it once your transaction "
            "has committed, e.g. transaction.on_commit(lambda: run_now(result.id)). "
            "Nothing was run."
        )
    settings = replace(get_settings(), LISTEN=False)
    claimed = job_claim_by_id(
        job_id,
        worker_id=inline_worker_id(),
        lease_seconds=settings.LEASE_SECONDS,
        namespace=namespace,
        db=db,
    )
    if claimed is None:
        _check_known(job_id, namespace, backend, db)
        return False
    run_claimed(claimed, settings)
    return True


def _job_id(result_id: str | int) -> int:
    if isinstance(result_id, bool) or not isinstance(result_id, (str, int)):
        raise TypeError(
            f"run_now() takes a job's result id (TaskResult.id, a string of digits, or "
            f"the job's int id), got {result_id!r}."
        )
    if isinstance(result_id, str) and not (result_id.isascii() and result_id.isdigit()):
        # int() would also take " 12", "1_2" or "١٢": none is a TaskResult.id
        raise ValueError(
            f"run_now() takes a job's result id (TaskResult.id, a string of digits), "
            f"got {result_id!r}."
        )
    job_id = int(result_id)
    if job_id <= 0:
        raise ValueError(f"run_now(): {result_id!r} is not a job's result id (ids are positive).")
    return job_id


def _check_known(job_id: int, namespace: str, backend: str, db: str) -> None:
    """After a claim found nothing: raise if the job is unknown here, else return."""
    found = job_namespace(job_id, db=db)
    if found is None:
        raise TaskResultDoesNotExist(
            f"run_now(): no job {job_id} (never enqueued, or purged after JOB_RETENTION); "
            "nothing was run."
        )
    if found != namespace:
        raise ValueError(
            f"run_now(): job {job_id} belongs to namespace {found!r}, not to TASKS alias "
            f"{backend!r}'s ({namespace!r}); pass the alias that enqueued it as backend=. "
            "Nothing was run."
        )
