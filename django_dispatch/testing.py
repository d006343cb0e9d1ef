"""Helpers for users' tests: run queued jobs through the real worker path.

No "eager" shortcut: ``drain()`` claims with the same query, runs on worker
threads with their own database connections, and completes through the same
fenced writes as ``rundispatch``. Jobs and their effects must therefore be
committed: use ``TransactionTestCase`` or
``@pytest.mark.django_db(transaction=True)``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from django.db import connections
from django.db.transaction import TransactionManagementError

from . import store
from .conf import get_settings
from .core.states import QUEUED_STATES
from .models import Job
from .runtime.connections import ride_out
from .runtime.options import WorkerOptions
from .runtime.worker import Worker
from .tasks.registry import backend_for, namespace_for

__all__ = ["assert_enqueued", "drain"]

#: Longest ``drain`` goes on with rounds that claim nothing while it makes
#: retries due: a job it cannot run must not keep it going for ever.
IDLE_SECONDS = 2.0


def drain(
    queues: Sequence[str] = (),
    *,
    concurrency: int = 1,
    async_concurrency: int = 0,
    worker_id: str = "test-worker",
    max_jobs: int | None = None,
    include_retries: bool = True,
    backend: str | None = None,
    capacity: dict[str, int] | None = None,
    locality: str = "",
) -> int:
    """Run every runnable job (as ``rundispatch --burst``); return how many ran.

    Of one namespace, as a worker: that of the TASKS alias ``backend``
    (``rundispatch --backend``); by default the ``"default"`` alias's, or the
    default namespace when that alias is not a DispatchBackend.

    With ``include_retries`` (the default), retries are made due at once and
    drained too, so a test sees a job's final outcome without waiting out
    its backoff. A retry no round can claim (its needs past ``capacity``, or
    a rate limit's window still full) ends the drain after ``IDLE_SECONDS``
    (2 s) of such rounds, the job still queued.

    ``async_concurrency``: as ``rundispatch --async-concurrency`` (async jobs
    together on one event loop).

    ``capacity``/``locality``: as ``rundispatch --capacity/--locality``.
    Without ``capacity``, like a worker without it, only jobs without
    resource needs run: pass one to drain jobs with needs.

    Refused inside a transaction (``TestCase``, ``transaction.atomic()``,
    ``ATOMIC_REQUESTS``): the jobs run on threads with their own connections,
    which cannot see the test's uncommitted rows and, on SQLite, would wait
    on its write lock until they gave up.
    """
    with store.using_backend(backend):  # the alias's database, the worker's threads too
        _refuse_in_transaction()
        settings = replace(get_settings(), POLL_INTERVAL=0.01, LISTEN=False)  # polls anyway
        if backend is None:
            default = backend_for("default")
            namespace = default.namespace if default is not None else ""
        else:
            namespace = namespace_for(backend)  # an unknown alias: ValueError
        total = 0
        idle_since: float | None = None  # since when rounds claimed nothing
        while max_jobs is None or total < max_jobs:
            worker = Worker(
                WorkerOptions(
                    worker_id=worker_id,
                    queues=queues,
                    namespace=namespace,
                    concurrency=concurrency,
                    async_concurrency=async_concurrency,
                    burst=True,
                    max_jobs=None if max_jobs is None else max_jobs - total,
                    scheduler=False,  # cron fires through scheduler.tick(), not drain()
                    capacity=capacity or {},
                    locality=locality,
                ),
                settings=settings,
                close_connections=False,
            )
            worker.run()
            total += worker.claimed_total
            if not include_retries:
                break
            # Retries waiting out a backoff become due, for another round; rounds
            # that claim nothing end it once none was, or after IDLE_SECONDS (a
            # retry this drain cannot run: needs past its capacity).
            now = time.monotonic()
            idle_since = None if worker.claimed_total else (idle_since or now)
            if idle_since is not None and now - idle_since > IDLE_SECONDS:
                break
            due = ride_out(
                lambda: store.jobs_retry_now(queues=queues, namespace=namespace),
                while_="between drain()'s rounds",
            )
            if not due and not worker.claimed_total:
                break
            if idle_since is not None:
                time.sleep(settings.POLL_INTERVAL)  # waiting for a window: no busy loop
        return total


def _refuse_in_transaction() -> None:
    db = store.db_alias()
    if connections[db].in_atomic_block:
        raise TransactionManagementError(
            "drain() cannot run inside a transaction (django.test.TestCase, "
            "transaction.atomic() or ATOMIC_REQUESTS): the jobs run on worker threads with "
            "their own database connections, which cannot see this transaction's "
            "uncommitted jobs and rows. Use django.test.TransactionTestCase (or "
            "@pytest.mark.django_db(transaction=True)) and call drain() outside "
            "transaction.atomic(). Nothing was run."
        )


def assert_enqueued(task_path: str, *, count: int | None = None, **filters: object) -> list[Job]:
    """Jobs of ``task_path`` still waiting to run (pending, or scheduled: deferred
    to later); assert how many when ``count`` is given.

    Read on the database of the enclosing ``store.using_backend(alias)`` block,
    else the ``default`` alias's: an alias with ``OPTIONS["DATABASE"]`` keeps
    its jobs there."""
    rows = Job.objects.using(store.caller_database())
    jobs = list(rows.filter(task_path=task_path, state__in=QUEUED_STATES, **filters))
    if count is not None and len(jobs) != count:
        raise AssertionError(
            f"expected {count} pending job(s) of {task_path}, found {len(jobs)}: "
            f"{[(j.pk, j.args, j.kwargs) for j in jobs]}"
        )
    return jobs
