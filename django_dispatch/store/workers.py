"""Worker rows: who is running, since when, seen when (for operators)."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError
from django.db.models.functions import Now

from ..models import Worker
from .base import db_alias, now_plus


def worker_register(
    worker_id: str,
    *,
    hostname: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    db: str | None = None,
) -> None:
    """Create or refresh this worker's row.

    Two single statements rather than ``update_or_create``: on SQLite a
    transaction that reads and then writes fails at once under contention,
    while a lone statement waits for the lock.
    """
    db = db or db_alias()
    fields = {
        "hostname": hostname,
        "pid": pid,
        "queues": list(queues),
        "concurrency": concurrency,
        "running_jobs": 0,
    }
    workers = Worker.objects.using(db)
    if workers.filter(id=worker_id).update(started_at=Now(), last_seen_at=Now(), **fields):
        return
    try:
        workers.create(id=worker_id, **fields)
    except IntegrityError:  # registered concurrently under the same id
        workers.filter(id=worker_id).update(last_seen_at=Now(), **fields)


def worker_touch(worker_id: str, *, running_jobs: int, db: str | None = None) -> None:
    Worker.objects.using(db or db_alias()).filter(id=worker_id).update(
        last_seen_at=Now(), running_jobs=running_jobs
    )


def worker_deregister(worker_id: str, *, db: str | None = None) -> None:
    Worker.objects.using(db or db_alias()).filter(id=worker_id).delete()


def workers_delete_stale(*, stale_seconds: float, db: str | None = None) -> int:
    """Delete Worker rows not seen for ``stale_seconds`` (jobs are untouched)."""
    deleted, _ = (
        Worker.objects.using(db or db_alias())
        .filter(last_seen_at__lt=now_plus(-stale_seconds))
        .delete()
    )
    return deleted
