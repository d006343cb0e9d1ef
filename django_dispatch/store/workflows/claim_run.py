"""Claim one given run's next runnable step job by id, for ``run_now`` (the Go store's
``ClaimRunByID``).

Why a claim of its own: a worker's claim (``store.claim.jobs_claim``) takes
*any* runnable job of its queues in claim order; ``run_now(run_id)`` must take
a job of *this* run, now, even one still waiting out a step's retry backoff,
so that the caller's process can run it inline instead of waiting for a
worker's poll. The lease it hands out is a worker's lease in every respect:
written by the claim's own ``leasing.jobs_lease`` (same columns: state, worker id, epoch
bump, expiry on the database clock, attempt count, ``worker_ids``) and
returned as the same ``ClaimedJob``, so every later write (completion, retry,
dead letter, renewal, the leader's rescue once the lease expires) is fenced
exactly as for a worker.

A job another claimer holds or has taken is never taken twice: the row is
locked with SKIP LOCKED and must still be ``pending`` (PostgreSQL re-checks
the condition on the locked row; SQLite claims under its write lock), and the
lease update is conditional on ``pending`` again.

Only jobs the worker's claim would lease without further rules are taken
here: no partition key, no concurrency key (per-task flow limits), no
resource needs, not in a paused queue, and not in a queue with
``DISPATCH["QUEUES"]`` limits (its concurrency and rate are counted by the
worker's claim gate, which a claim by id would bypass). Step jobs carry none
of the first three; a step of a paused or limited queue is left to the
workers, which resume it with its queue or admit it within its limits.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Case, IntegerField, Value, When
from django.db.models.functions import Now

from ...conf import queue_limits
from ...core.states import QUEUED_STATES
from ...core.workflow_states import StepState
from ...models import Job, WorkflowRun, WorkflowTask
from ..base import take_sqlite_write_lock
from ..flow import queues_paused
from ..leasing import claimed_job, jobs_lease
from ..staging import jobs_stage_now
from ..types import CLAIM_FIELDS, ClaimedJob
from .common import db_or_default
from .stepjobs import BATCH_TASK


def workflow_run_claim_step(
    run_id: int, *, worker_id: str, lease_seconds: float, db: str | None = None
) -> ClaimedJob | None:
    """Lease the job of run ``run_id``'s next runnable step to ``worker_id``.

    "Next" is the ``ready`` step first in definition order (``sequence``)
    whose job is still pending, even if its ``run_after`` (a retry's backoff)
    has not come yet. One short transaction, committed before any step code
    runs, as a worker's claim. Returns None when no step of the run can be
    claimed now: none is ready (the run waits for an event, a timer or a
    child run, is stuck or finished), or its job is already claimed (by a
    worker or another ``run_now``), or its queue is paused or limited, or
    it is a child of a ``ctx.map`` batch (``mapbatch``: its job runs the
    batch's other children too, left to the workers). Raises
    ``WorkflowRun.DoesNotExist`` for an unknown run.
    """
    db = db_or_default(db)
    run = WorkflowRun.objects.using(db).filter(id=run_id).values("namespace").first()
    if run is None:
        raise WorkflowRun.DoesNotExist(
            f"workflow run {run_id} does not exist (never started, or purged after "
            "WORKFLOW_RETENTION); nothing was run."
        )
    namespace = run["namespace"]
    ready = [
        job_id
        for job_id in WorkflowTask.objects.using(db)
        .filter(run_id=run_id, state=StepState.READY, job_id__isnull=False)
        .order_by("sequence", "id")
        .values_list("job_id", flat=True)
        if job_id is not None
    ]
    if not ready:
        return None
    left_to_workers = queues_paused(db, namespace=namespace) | set(queue_limits())
    # savepoint=False: like jobs_claim, one transaction of our own.
    with transaction.atomic(using=db, savepoint=False):
        take_sqlite_write_lock(db)
        candidates = (
            Job.objects.using(db)
            .filter(
                id__in=ready,
                namespace=namespace,
                state__in=QUEUED_STATES,  # a step backing off runs now too
                partition_key__isnull=True,
                concurrency_key__isnull=True,
                resource_shape__isnull=True,
            )
            .exclude(task_path=BATCH_TASK)
        )  # a batch's job would run its other children too
        if left_to_workers:
            candidates = candidates.exclude(queue_name__in=sorted(left_to_workers))
        # Definition order; LIMIT 1 with SKIP LOCKED locks that one row only.
        order = Case(
            *[When(id=job_id, then=Value(i)) for i, job_id in enumerate(ready)],
            output_field=IntegerField(),
        )
        row = (
            candidates.order_by(order)
            .select_for_update(skip_locked=True)
            .annotate(db_now=Now())
            .values(*CLAIM_FIELDS, "db_now")
            .first()
        )
        if row is None:
            return None
        jobs_stage_now(db, [row["id"]])
        jobs_lease(db, [row], worker_id, row["db_now"], lease_seconds)
    return claimed_job(row, worker_id, row["db_now"], namespace)
