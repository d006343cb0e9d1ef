"""``run_now``'s worker: one job claimed by id and run in the caller's process.

The caller becomes a worker for the length of one job: it claims the job by
id (a run's next runnable step job, ``store.workflows.workflow_run_claim_step``,
for ``workflows.run_now``; the job named, ``store.claim_by_id``, for
``django_dispatch.run_now``: a worker's lease in every respect), registers a
short-lived worker row named ``run_now:<host>:<pid>:<random>``, and runs the
job through the worker's own machinery (``Worker``: the job thread and
``JobRunner``, the executor, the completer's fenced writes, the heartbeat
renewing the lease, the overseer's timeouts), then deregisters. So retries,
dead letters, the workflow's advancement, durable waits, usage records and
timeouts behave as on a worker; the job's code runs on a job thread of the
caller's process while the calling thread keeps the lease alive, and the call
returns once the outcome is committed.

Differences from ``rundispatch``, each because the process is the caller's:
no LISTEN connection, no leadership, reclaim, purge or cron (those must not
run on a request's thread; the namespace's leader does them), no signal
handlers, and no recycling: as under ``drain()``, a step over its timeout is
failed and its thread abandoned rather than the process re-executed.

If the caller dies mid-step (SIGKILL, OOM), its lease stops being renewed:
the namespace's leader returns the job to the queue once the lease expires
(a ``WorkerLost`` attempt, as for any worker) and deletes the stale worker
row after ``WORKER_STALE_SECONDS``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace

from .. import store
from ..conf import DispatchSettings, get_settings
from ..store import workflows as wf_store
from ..store.wave import WaveClaim
from .maintenance import Maintenance
from .options import Every, WorkerOptions
from .producer import Producer
from .worker import Worker

#: Worker ids of ``run_now`` callers start with this (admin, logs, usage records).
INLINE_WORKER_PREFIX = "run_now:"


def inline_worker_id() -> str:
    return f"{INLINE_WORKER_PREFIX}{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


class _NoMaintenance(Maintenance):
    """No leadership, reclaim, purge nor cron on the caller's thread."""

    def duties(self, *, cron: bool) -> list[Every]:
        return []


class _GivenClaim(Producer):
    """A producer whose only claim is the job already claimed for it (``given``)."""

    given: store.ClaimedJob | None = None

    def claim(self, limit: int) -> list[store.ClaimedJob]:
        claimed, self.given = self.given, None
        return [claimed] if claimed is not None else []

    def fused_claim(self, limit: int) -> WaveClaim | None:
        """Never the one-statement wave: its claim is SQL that would lease other
        jobs, never this one's given job (``claim``)."""
        return None


class _InlineWorker(Worker):
    """A worker whose only claim is the job already claimed for it."""

    producer_class = _GivenClaim

    def __init__(
        self, claimed: store.ClaimedJob, options: WorkerOptions, settings: DispatchSettings
    ) -> None:
        super().__init__(options, settings, close_connections=False)
        assert isinstance(self.producer, _GivenClaim)
        self.producer.given = claimed

    def _loop(self, maintenance: Maintenance) -> None:
        quiet = _NoMaintenance(
            self.options.worker_id, self.settings, self.db, maintenance.namespace
        )
        super()._loop(quiet)


def run_next_step(run_id: int) -> list[int]:
    """Claim run ``run_id``'s next runnable step job and run it here; return ``[job id]``,
    or ``[]`` when nothing could be claimed (see ``workflow_run_claim_step``)."""
    settings = replace(get_settings(), LISTEN=False)
    worker_id = inline_worker_id()
    db = store.db_alias()
    claimed = wf_store.workflow_run_claim_step(
        run_id, worker_id=worker_id, lease_seconds=settings.LEASE_SECONDS, db=db
    )
    if claimed is None:
        return []
    run_claimed(claimed, settings)
    return [claimed.id]


def run_claimed(claimed: store.ClaimedJob, settings: DispatchSettings) -> None:
    """Run a job claimed by id for this process (its lease's worker id) as a
    one-job worker; return once its outcome is committed."""
    worker = _InlineWorker(
        claimed,
        WorkerOptions(
            worker_id=claimed.lease.worker_id,
            namespace=claimed.lease.namespace,
            queues=[claimed.row["queue_name"]],
            concurrency=1,
            max_jobs=1,  # stop claiming after this one, and let it run to completion
            scheduler=False,
            recycle=False,
        ),
        settings,
    )
    worker.run()
