"""The claim of one job named by its id (``run_now``), through the claim's own gates.

A worker's claim scans the claim index in order; ``run_now`` names the job.
Everything else is the claim's: the row is locked with SKIP LOCKED (a job
another claimer is leasing right now is not waited for, and not taken), its
partition must let it run (``gates.partitions``: its key's head, and nothing
of the key running), its task group's and queue's concurrency and rate limits
must admit it (``gates.limits``: under the group's lock, counting after it),
its queue must not be paused, and the lease is ``leasing.jobs_lease``'s, so
the new epoch fences out any earlier holder exactly as a claim does.

What it does not ask, on purpose:

- ``run_after``: a job deferred to later (``run_after``, a retry's backoff)
  runs now. Asking for *this* job *now* is the point of the call.
- resource needs and locality: they say which *worker* may take the job
  (what it declared with ``--capacity``/``--locality``); the caller is not a
  worker that declared any, and named the job itself. Call it where the
  job's resources are.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models.functions import Now

from ..core.states import QUEUED_STATES
from ..models import Job
from .base import db_alias, take_sqlite_write_lock
from .flow import flow_state_read
from .gates.limits import ConcurrencyGate
from .gates.partitions import sort_out_partitions
from .leasing import claimed_job, jobs_lease
from .staging import jobs_stage_now
from .types import CLAIM_FIELDS, ClaimedJob


def job_claim_by_id(
    job_id: int,
    *,
    worker_id: str,
    lease_seconds: float,
    namespace: str = "",
    db: str | None = None,
) -> ClaimedJob | None:
    """Lease pending or scheduled job ``job_id`` of ``namespace`` to ``worker_id``,
    or None. A scheduled job runs now, whatever its ``run_after``.

    None when the job is not claimable now: not pending or scheduled (running, blocked
    behind its partition or a limit, finished, cancelled, or unknown in this
    namespace), locked by a claimer this very moment, in a paused queue, held
    behind its partition's head or running job, or over its group's or
    queue's limits. As in a claim, a job found waiting behind its partition
    or at its group's cap is set aside (blocked) in this transaction, to be
    promoted when its turn comes. One short transaction, committed before any
    task code runs.
    """
    db = db or db_alias()
    with transaction.atomic(using=db, savepoint=False):
        take_sqlite_write_lock(db)
        row = (
            Job.objects.using(db)
            .filter(id=job_id, namespace=namespace, state__in=QUEUED_STATES)
            .select_for_update(skip_locked=True)
            .annotate(db_now=Now())
            .values(*CLAIM_FIELDS, "db_now")
            .first()
        )
        if row is None:
            return None
        flow = flow_state_read(db, namespace)
        if row["queue_name"] in flow.paused:
            return None
        runnable, _ = sort_out_partitions(db, [row], [], [], namespace)
        if runnable and (row["concurrency_key"] is not None or row["queue_name"] in flow.limits):
            gate = ConcurrencyGate(db, namespace, flow.limits, flow)
            runnable = gate.sort(runnable, 1)[0]
        if not runnable:
            return None
        now: datetime = row["db_now"]
        jobs_stage_now(db, [job_id])  # a deferred job named by id runs now
        jobs_lease(db, [row], worker_id, now, lease_seconds)
    return claimed_job(row, worker_id, now, namespace)


def job_namespace(job_id: int, *, db: str | None = None) -> str | None:
    """The namespace of job ``job_id``, or None when no such job exists (never
    enqueued, or purged after its retention)."""
    return (
        Job.objects.using(db or db_alias())
        .filter(id=job_id)
        .values_list("namespace", flat=True)
        .first()
    )
