"""Cluster-wide maintenance, run by the leader only.

Reclaiming expired leases, deleting stale Worker rows and the retention
purge must not run on every worker at once (they would compete for the same
rows). Each step is still safe to run twice, so a leader that loses its lease
mid-step does no harm.
"""

from __future__ import annotations

import logging

from .. import store
from ..conf import DispatchSettings

logger = logging.getLogger("django_dispatch.maintenance")


class Maintenance:
    def __init__(self, worker_id: str, settings: DispatchSettings, db: str) -> None:
        self.worker_id = worker_id
        self.settings = settings
        self.db = db
        self.leader = False

    def elect(self) -> bool:
        """Take or renew leadership; log transitions."""
        leader = store.leadership_acquire(
            self.worker_id, ttl=self.settings.LEASE_SECONDS, db=self.db
        )
        if leader != self.leader:
            logger.info("worker %s %s leadership", self.worker_id, "took" if leader else "lost")
        self.leader = leader
        return leader

    def reclaim(self) -> None:
        if not self.leader:
            return
        store.jobs_rescue_expired(max_worker_lost=self.settings.MAX_WORKER_LOST, db=self.db)
        store.workers_delete_stale(stale_seconds=self.settings.WORKER_STALE_SECONDS, db=self.db)

    def purge(self) -> None:
        """One bounded batch per kind; the next interval continues."""
        if not self.leader:
            return
        cfg = self.settings
        jobs = store.jobs_purge(cfg.JOB_RETENTION, batch=cfg.PURGE_BATCH, db=self.db)
        letters = store.dead_letters_purge(
            older_than=cfg.DEAD_LETTER_RETENTION, batch=cfg.PURGE_BATCH, db=self.db
        )
        if jobs or letters:
            logger.info("retention: deleted %s jobs and %s dead letters", jobs, letters)

    def resign(self) -> None:
        if self.leader:
            store.leadership_release(self.worker_id, db=self.db)
            self.leader = False
