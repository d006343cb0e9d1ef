"""The leader's retention duty for events and workflow runs (one of
``Maintenance.purge``'s duties, kept apart so that its list gains one line)."""

from __future__ import annotations

import logging

from ..conf import DispatchSettings
from ..store import workflows as wf_store
from ..store.events import events_purge, events_purge_unacked

logger = logging.getLogger("django_dispatch.maintenance")

#: Longest each purge may run per PURGE_INTERVAL (like the job purge's budget).
MAX_SECONDS = 1.0


def purge_events_and_runs(cfg: DispatchSettings, *, db: str, namespace: str) -> tuple[int, int]:
    """Delete acked events past ``EVENT_RETENTION``, unacked ones past
    ``EVENT_UNACKED_RETENTION`` (see ``events_purge_unacked``) and finished runs
    past ``WORKFLOW_RETENTION``, in ``PURGE_BATCH`` batches; return (events, runs)."""
    events = events_purge(
        cfg.EVENT_RETENTION,
        batch=cfg.PURGE_BATCH,
        max_seconds=MAX_SECONDS,
        namespace=namespace,
        db=db,
    )
    if cfg.EVENT_UNACKED_RETENTION is not None:
        events += events_purge_unacked(
            cfg.EVENT_UNACKED_RETENTION,
            batch=cfg.PURGE_BATCH,
            max_seconds=MAX_SECONDS,
            namespace=namespace,
            db=db,
        )
    runs = wf_store.workflow_runs_purge(
        cfg.WORKFLOW_RETENTION,
        batch=cfg.PURGE_BATCH,
        max_seconds=MAX_SECONDS,
        namespace=namespace,
        db=db,
    )
    if events or runs:
        logger.info("retention: deleted %s events and %s workflow runs", events, runs)
    return events, runs
