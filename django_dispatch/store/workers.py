"""Worker rows: who is running, since when, seen when (for operators)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

from ..models import Worker
from .base import db_alias, now_plus

logger = logging.getLogger("django_dispatch.store")


def worker_register(
    worker_id: str,
    *,
    hostname: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    db: str | None = None,
    namespace: str = "",
    capacity: dict[str, int] | None = None,
    locality: str | None = None,
) -> None:
    """Create or refresh this incarnation's row (serving ``namespace``).

    Refreshes the row only while it is still this process's (same host and
    pid: ``take_id`` registered it, or a recycled predecessor under the same
    pid did). A row another process holds means this one was judged dead
    since and its id taken over: ``WorkerIdTaken``, as at a heartbeat.
    Overwriting it would make two live processes of one id.

    Lone statements rather than ``update_or_create``: on SQLite a
    transaction that reads and then writes fails at once under contention,
    while a lone statement waits for the lock.
    """
    db = db or db_alias()
    fields = _fields(hostname, pid, queues, concurrency, running_jobs=0, namespace=namespace)
    fields.update(capacity=capacity or None, locality=locality or None)
    row = Worker.objects.using(db).filter(id=worker_id)
    if row.filter(hostname=hostname, pid=pid).update(
        started_at=Now(), last_seen_at=Now(), **fields
    ):
        return
    _raise_if_taken(worker_id, row)
    _create(worker_id, fields, db)


def _raise_if_taken(worker_id: str, row: QuerySet[Worker]) -> None:
    taken = row.values("hostname", "pid").first()
    if taken is not None:
        raise WorkerIdTaken(
            f"worker {worker_id}: its id was taken over by pid {taken['pid']} on host "
            f"{taken['hostname']} (this process was judged dead: frozen past its heartbeats)"
        )


def worker_touch(
    worker_id: str,
    *,
    running_jobs: int,
    hostname: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    db: str | None = None,
    namespace: str = "",
    capacity: dict[str, int] | None = None,
    locality: str | None = None,
) -> bool:
    """The heartbeat's write to the worker's row; True if the row had to be recreated.

    Raises ``WorkerIdTaken`` when another incarnation registered under this
    id meanwhile (``runtime.takeover`` judged this one dead, by its heartbeat):
    two live processes must never share an id, so this one has to stop.

    The leader deletes rows not seen for ``WORKER_STALE_SECONDS``. A worker
    that was only paused that long (SIGSTOP, a suspended VM, a host frozen
    under swap) and carries on must show up again, so the heartbeat brings
    its row back. One UPDATE as usual; an INSERT only once the row is gone
    (its ``started_at`` is then the time it came back).
    """
    db = db or db_alias()
    row = Worker.objects.using(db).filter(id=worker_id)
    if row.filter(hostname=hostname, pid=pid).update(last_seen_at=Now(), running_jobs=running_jobs):
        return False
    _raise_if_taken(worker_id, row)
    fields = _fields(
        hostname, pid, queues, concurrency, running_jobs=running_jobs, namespace=namespace
    )
    fields.update(capacity=capacity or None, locality=locality or None)
    _create(worker_id, fields, db)
    logger.warning(
        "worker %s: its row was gone (deleted as stale while the worker was paused?); recreated it",
        worker_id,
    )
    return True


def _fields(
    hostname: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    *,
    running_jobs: int,
    namespace: str = "",
) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "hostname": hostname,
        "pid": pid,
        "queues": list(queues),
        "concurrency": concurrency,
        "running_jobs": running_jobs,
    }


def _create(worker_id: str, fields: dict[str, Any], db: str) -> None:
    """Insert the row. Inserted meanwhile under the same id, it is refreshed only
    if it is this incarnation's; another process's means this one's id was
    taken over (``WorkerIdTaken``)."""
    workers = Worker.objects.using(db)
    try:
        workers.create(id=worker_id, **fields)
    except IntegrityError:  # registered concurrently under the same id
        row = workers.filter(id=worker_id)
        ours = row.filter(hostname=fields["hostname"], pid=fields["pid"])
        if not ours.update(last_seen_at=Now(), **fields):
            _raise_if_taken(worker_id, row)


def worker_deregister(
    worker_id: str, *, db: str | None = None, hostname: str | None = None, pid: int | None = None
) -> None:
    """Delete the worker's row; with ``hostname`` and ``pid``, only if it is still
    this incarnation's (one whose id was taken over leaves the new owner's row)."""
    rows = Worker.objects.using(db or db_alias()).filter(id=worker_id)
    if hostname is not None and pid is not None:
        rows = rows.filter(hostname=hostname, pid=pid)
    rows.delete()


def workers_delete_stale(
    *, stale_seconds: float, db: str | None = None, namespace: str = ""
) -> int:
    """Delete ``namespace``'s Worker rows not seen for ``stale_seconds`` (jobs are untouched)."""
    deleted, _ = (
        Worker.objects.using(db or db_alias())
        .filter(namespace=namespace, last_seen_at__lt=now_plus(-stale_seconds))
        .delete()
    )
    return deleted


class WorkerIdTaken(Exception):
    """Another process registered under this worker's id after it did."""


@dataclass(frozen=True, slots=True)
class Incarnation:
    """What the worker row of an id says about the process registered under it."""

    hostname: str
    pid: int
    namespace: str
    #: Seconds since its last heartbeat, on the database clock.
    seen_ago: float
    #: Seconds since it registered, on the database clock: a process found at
    #: its pid that is younger than this is another process (a pid reused).
    age: float = 0.0


def worker_incarnation(worker_id: str, *, db: str | None = None) -> Incarnation | None:
    """The process registered under ``worker_id``, or None when no row has that id."""
    row = (
        Worker.objects.using(db or db_alias())
        .filter(id=worker_id)
        .annotate(db_now=Now())
        .values("hostname", "pid", "namespace", "last_seen_at", "started_at", "db_now")
        .first()
    )
    if row is None:
        return None
    seen_ago = max(0.0, (row["db_now"] - row["last_seen_at"]).total_seconds())
    age = max(0.0, (row["db_now"] - row["started_at"]).total_seconds())
    return Incarnation(row["hostname"], row["pid"], row["namespace"], seen_ago, age)


def worker_take_id(
    worker_id: str,
    previous: Incarnation | None,
    *,
    hostname: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    db: str | None = None,
    namespace: str = "",
    capacity: dict[str, int] | None = None,
    locality: str | None = None,
) -> bool:
    """Register this process under ``worker_id`` if the row still is ``previous``.

    A compare-and-set on the row's host and pid (None: no row at all), so
    of two processes starting under one id at once only one takes it; the
    other gets False, reads the row again and finds the winner alive.
    """
    db = db or db_alias()
    fields = _fields(hostname, pid, queues, concurrency, running_jobs=0, namespace=namespace)
    fields.update(capacity=capacity or None, locality=locality or None)
    workers = Worker.objects.using(db)
    if previous is None:
        try:
            with transaction.atomic(using=db):
                workers.create(id=worker_id, **fields)
        except IntegrityError:  # registered meanwhile
            return False
        return True
    row = workers.filter(id=worker_id, hostname=previous.hostname, pid=previous.pid)
    return row.update(started_at=Now(), last_seen_at=Now(), **fields) == 1
