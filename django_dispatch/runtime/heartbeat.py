"""The heartbeat: renew every lease this process holds, and say the process is alive.

Run by the control loop every ``HEARTBEAT_INTERVAL``, never by a job thread,
so a task that blocks its thread cannot let its own lease expire. A lease
that no longer renews means the job was cancelled or taken over: its code
is asked to stop, and the overseer (``timeouts``) starts its grace period.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .. import store
from ..observability import joblog, metrics
from ..store.workers import WorkerIdTaken
from .slots import Slots
from .timeouts import Overseer

logger = logging.getLogger("django_dispatch.worker")


class Heartbeat:
    """Lease renewal and the worker row's touch, for one worker process."""

    def __init__(
        self,
        slots: Slots,
        overseer: Overseer,
        *,
        worker_id: str,
        registration: dict[str, Any],
        lease_seconds: float,
        db: str,
        capacity: int,
    ) -> None:
        self.slots = slots
        self.overseer = overseer
        self.worker_id = worker_id
        #: What the worker row says about this process (see ``store.workers``).
        self.registration = registration
        self.lease_seconds = lease_seconds
        self.db = db
        self.capacity = capacity  # slots of this process, threads and event loop
        #: Called with why, when another process took this worker's id over.
        self.on_taken: Callable[[str], None] | None = None

    def beat(self) -> None:
        """Renew every lease this worker holds; stop the jobs it lost."""
        with self.slots.lock:
            leases = [r.claimed.lease for r in self.slots.running.values()]
        lost = store.jobs_renew_leases(leases, lease_seconds=self.lease_seconds, db=self.db)
        for job_id in lost:
            with self.slots.lock:
                running = self.slots.running.get(job_id)
            # A written outcome (an atomic success committed with its body, its
            # report still running) is not lost: its row simply is not running.
            if running is not None and not running.persisted and not running.cancel_event.is_set():
                logger.info(
                    "job %s: cancelled or lost; asking it to stop",
                    job_id,
                    extra=joblog.job_fields(running.claimed),
                )
                running.stop()
                self.overseer.asked_to_stop(running, time.monotonic())
        if metrics.WORKER is not None:
            metrics.WORKER.heartbeat(busy=len(leases), slots=self.capacity)
        # Recreates the row if the leader deleted it (after a long pause).
        try:
            store.worker_touch(self.worker_id, running_jobs=len(leases), **self.registration)
        except WorkerIdTaken as e:
            # Its jobs were taken back (their epochs bumped: its writes are
            # fenced out); going on would make two live processes of one id.
            logger.error("%s; this process stops", e, extra=joblog.worker_fields(self.worker_id))
            if self.on_taken is not None:
                self.on_taken(str(e))

    @property
    def owner(self) -> dict[str, Any]:
        """This incarnation, for deleting its row only (``store.worker_deregister``)."""
        return {"hostname": self.registration["hostname"], "pid": self.registration["pid"]}
