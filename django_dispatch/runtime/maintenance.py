"""Cluster-wide maintenance, run by the leader only.

Reclaiming expired leases, deleting stale Worker rows and the retention
purge must not run on every worker at once (they would compete for the same
rows). Each step is still safe to run twice, so a leader that loses its lease
mid-step does no harm.

A worker that takes leadership reclaims at once, not at its next
``RECLAIM_INTERVAL``: when the previous leader died, its own jobs' leases ran
out with its leadership, so they are due when a successor takes office.

The housekeeping (the retention purge, the partition and artifact sweeps)
keeps nothing from running: it waits a few seconds after start rather than
hold the first claim back, and a leader that stops before it ran does it
on the way out, so that short-lived workers (``--burst``, ``--max-jobs``)
still purge.

Everything here is scoped to the worker's namespace: each namespace elects
its own leader, which reclaims, purges and sweeps that namespace's rows only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import store
from ..conf import DispatchSettings
from ..observability import joblog, metrics
from ..store.artifacts import artifacts_sweep
from ..store.dead_letters import purge_past_retention
from ..store.usage import usage_purge
from . import scheduler
from .options import Every
from .retention import purge_events_and_runs
from .sweeps import RECLAIM_SWEEPS

logger = logging.getLogger("django_dispatch.maintenance")

#: Longest a purge may run on the control loop per PURGE_INTERVAL.
PURGE_MAX_SECONDS = 2.0
#: Elections, from the one that takes office, that also reclaim (see ``elect``).
TAKEOVER_SWEEPS = 3
#: Seconds after start before the first housekeeping (at most its interval):
#: the start-up's claims come first.
HOUSEKEEPING_DELAY = 5.0


class Maintenance:
    def __init__(
        self, worker_id: str, settings: DispatchSettings, db: str, namespace: str = ""
    ) -> None:
        self.worker_id = worker_id
        self.namespace = namespace
        self.settings = settings
        self.db = db
        self.leader = False
        self.takeover_sweeps = 0  # how many of the next elections also reclaim
        #: Whether this worker ran the housekeeping as the leader (see ``resign``).
        self.housekept = False

    def duties(self, *, cron: bool) -> list[Every]:
        """This worker's periodic maintenance: the election at once (a crashed
        predecessor's expired leases are swept when this worker takes office),
        then reclaims; the housekeeping from ``HOUSEKEEPING_DELAY`` on; cron
        ticks at once (``cron``), and the cluster gauges under ``--metrics-port``.

        The reclaim duty is not run at start: the election just before it
        reclaims if this worker took office, and a worker that is not the
        leader reclaims nothing.
        """
        cfg = self.settings
        duties = [
            Every(cfg.HEARTBEAT_INTERVAL, self.elect),
            Every(cfg.RECLAIM_INTERVAL, self.reclaim, start_now=False),
            *(
                _after(min(HOUSEKEEPING_DELAY, cfg.PURGE_INTERVAL), cfg.PURGE_INTERVAL, duty)
                for duty in (self.purge, self.unstick_partitions, self.sweep_artifacts)
            ),
        ]
        if cron:
            duties.append(
                Every(cfg.SCHEDULER_INTERVAL, lambda: scheduler.tick(namespace=self.namespace))
            )
        if metrics.SINK is not None:  # rundispatch --metrics-port: the cluster gauges
            duties.append(Every(cfg.RECLAIM_INTERVAL, self.publish_metrics))
        return duties

    def elect(self) -> bool:
        """Take or renew leadership; log transitions; reclaim at once on taking office.

        A dead leader renewed its jobs' leases and its leadership in the same
        loop, every ``HEARTBEAT_INTERVAL``, so the last of its jobs' leases
        ends at most about one interval after its leadership does. The
        election that takes office and the next two (one interval apart)
        each sweep: every job of a dead leader is back in the queue within
        about a heartbeat of its lease's expiry, not at the new leader's
        next ``RECLAIM_INTERVAL``.
        """
        was_leader = self.leader
        self.leader = False  # until the database confirms: a failed election demotes us
        self.leader = store.leadership_acquire(
            self.worker_id, ttl=self.settings.LEASE_SECONDS, db=self.db, namespace=self.namespace
        )
        if self.leader != was_leader:
            logger.info(
                "worker %s %s leadership", self.worker_id, "took" if self.leader else "lost"
            )
        if not self.leader:
            self.takeover_sweeps = 0
        elif not was_leader:
            self.takeover_sweeps = TAKEOVER_SWEEPS
        if self.takeover_sweeps:
            self.takeover_sweeps -= 1
            self.reclaim()
        return self.leader

    def reclaim(self) -> None:
        if not self.leader:
            return
        max_lost = self.settings.MAX_WORKER_LOST

        def report(row: Mapping[str, Any], failed: bool) -> None:
            joblog.worker_lost(row, failed=failed, max_worker_lost=max_lost, by=self.worker_id)

        store.jobs_rescue_expired(
            max_worker_lost=max_lost, db=self.db, report=report, namespace=self.namespace
        )
        for sweep in RECLAIM_SWEEPS:
            sweep(self.settings.LEASE_SECONDS, self.namespace)
        store.workers_delete_stale(
            stale_seconds=self.settings.WORKER_STALE_SECONDS, db=self.db, namespace=self.namespace
        )

    def publish_metrics(self) -> None:
        """``--metrics-port``: the leader reads the cluster gauges (one bounded query
        set per ``RECLAIM_INTERVAL``); a worker that is not the leader exports none."""
        cfg = self.settings
        metrics.publish_cluster(
            self.leader, interval=cfg.RECLAIM_INTERVAL, live_within=cfg.LEASE_SECONDS, db=self.db
        )

    def unstick_partitions(self) -> None:
        """Promote partitions left blocked by a race (see ``partitions_promote_stalled``)."""
        if not self.leader:
            return
        promoted = store.partitions_promote_stalled(self.db, namespace=self.namespace)
        if promoted:
            logger.warning(
                "partitions: %s blocked jobs had nothing ahead of them (a write bypassed "
                "the partition lock: please report it); promoted them",
                promoted,
            )

    def purge(self) -> None:
        """Bounded batches until caught up or ``PURGE_MAX_SECONDS`` pass.

        Each batch is a short statement, so the claim path never waits long;
        the time budget keeps the control loop responsive; repeating batches
        lets a busy site's purge keep up with its finishing rate.
        """
        if not self.leader:
            return
        self.housekept = True
        cfg = self.settings
        jobs, letters = purge_past_retention(
            cfg.JOB_RETENTION,
            dead_letter_retention=cfg.DEAD_LETTER_RETENTION,
            batch=cfg.PURGE_BATCH,
            max_seconds=PURGE_MAX_SECONDS,
            db=self.db,
            namespace=self.namespace,
        )
        if jobs or letters:
            logger.info("retention: deleted %s jobs and %s dead letters", jobs, letters)
        purge_events_and_runs(cfg, db=self.db, namespace=self.namespace)
        records = usage_purge(
            older_than=cfg.USAGE_RETENTION,
            batch=cfg.PURGE_BATCH,
            max_seconds=PURGE_MAX_SECONDS,
            db=self.db,
            namespace=self.namespace,
        )
        if records:
            logger.info("retention: deleted %s usage records", records)

    def sweep_artifacts(self) -> None:
        """One bounded round of the artifact lifecycle (see ``store.artifacts``)."""
        if not self.leader:
            return
        cfg = self.settings
        counts = artifacts_sweep(
            orphan_seconds=cfg.ARTIFACT_ORPHAN_SECONDS,
            purge_grace=cfg.ARTIFACT_PURGE_GRACE,
            batch=cfg.PURGE_BATCH,
            namespace=self.namespace,
            cursor=getattr(self, "artifact_cursor", None),
            db=self.db,
        )
        self.artifact_cursor = counts.cursor  # the windowed sweeps go on from here
        if counts.busy:
            logger.info("artifacts: %s", counts)

    def resign(self) -> None:
        """On the way out: the housekeeping if it never ran (a leader that lived
        less than ``HOUSEKEEPING_DELAY``), let go of the leadership, stop
        exporting live gauges."""
        if self.leader and not self.housekept:
            try:
                self.purge()
                self.unstick_partitions()
                self.sweep_artifacts()
            except Exception:  # the release below matters more: the next leader purges
                logger.exception("housekeeping on the way out failed; the next leader does it")
        if metrics.WORKER is not None:
            metrics.WORKER.heartbeat(busy=0, slots=0)
            metrics.publish_cluster(False, interval=1.0, live_within=1.0, db=self.db)
        if self.leader:
            if store.leadership_release(self.worker_id, db=self.db, namespace=self.namespace):
                logger.info(
                    "worker %s stepped down as leader%s (clean stop): the next worker's tick "
                    "takes over",
                    self.worker_id,
                    f" of namespace {self.namespace!r}" if self.namespace else "",
                )
            self.leader = False


def _after(delay: float, interval: float, run: Callable[[], object]) -> Every:
    """A duty every ``interval`` seconds whose first run is ``delay`` seconds from now."""
    duty = Every(interval, run, start_now=False)
    duty.next_at = time.monotonic() + delay
    return duty
