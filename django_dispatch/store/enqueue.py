"""Inserting jobs: always in the caller's transaction, if there is one."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError, transaction

from ..models import Job
from ..states import LIVE, JobState


def jobs_insert(jobs: Sequence[Job], *, db: str, batch_size: int = 5000) -> list[Job]:
    """Insert pending jobs.

    A job inserted inside ``transaction.atomic()`` exists exactly when the
    surrounding data does: a rollback removes it and no worker can see it
    before commit. On PostgreSQL an INSERT trigger sends NOTIFY, delivered at
    commit. ``enqueued_at`` and ``run_after`` come back through RETURNING.
    Partitioned jobs go in as pending too; the claim sorts out which one is
    its partition's head (see ``partitions``).
    """
    for job in jobs:
        job.state = JobState.PENDING
    if len(jobs) == 1:
        jobs[0].save(using=db, force_insert=True)
        return list(jobs)
    return Job.objects.using(db).bulk_create(jobs, batch_size=batch_size)


def job_insert_idempotent(job: Job, *, db: str) -> tuple[Job, bool]:
    """Insert ``job`` unless a live job holds its (task, idempotency key).

    Returns (the job, created). The partial unique index decides: two
    concurrent inserts of one key create one job, the other waits for the
    first to commit and gets it back. The attempt runs in a savepoint, so a
    conflict never aborts the caller's transaction.
    """
    for _ in range(3):
        try:
            with transaction.atomic(using=db):
                jobs_insert([job], db=db)
            return job, True
        except IntegrityError:
            existing = (
                Job.objects.using(db)
                .filter(
                    task_path=job.task_path,
                    idempotency_key=job.idempotency_key,
                    state__in=list(LIVE),
                )
                .first()
            )
            if existing is not None:
                return existing, False
            job.pk = None  # the holder finished meanwhile: the key is free again
    raise IntegrityError(
        f"could not enqueue {job.task_path} with idempotency key {job.idempotency_key!r}: "
        "it kept conflicting with jobs that finished at once; try again"
    )
