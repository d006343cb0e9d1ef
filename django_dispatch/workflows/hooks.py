"""What workflows plug into the layers below them, at startup.

Events and the runtime sit below workflows (a wait reads events and takes
their lock; a step runs as a job), so they cannot import them. Workflows
hook in instead, in ``connect()``, called from the app's ``ready()``:

- a publish wakes the steps waiting on its event (``events.on_publish``):
  registered at startup, it reaches every process that publishes, whether
  or not it ever imported a workflow; run in the publish's transaction,
  under the event-name lock, a wake-up commits or rolls back with the event;
- the leader's reclaim also sweeps the steps whose job ended without
  finishing them, and the child runs whose parent step stopped waiting for
  them without cancelling them (``runtime.sweeps.RECLAIM_SWEEPS``).
"""

from __future__ import annotations

from ..models import Event
from ..runtime.sweeps import RECLAIM_SWEEPS
from ..services import events
from ..store import workflows as wf_store


def wake_waiting_steps(db: str, event: Event) -> int:
    """waiting -> ready for every step waiting on ``event``; how many woke."""
    # Imported at the first publish, not at startup: defining ``run_step``
    # needs the TASKS backends, which ``ready()`` must not require.
    from .tasks import build_step_job

    return wf_store.wake_waiting_steps(db, event, build_step_job)


def sweep_stale_steps(older_than_seconds: float, namespace: str) -> list[int]:
    """Steps whose job ended without finishing them count an attempt (retried or failed)."""
    from .tasks import build_step_job  # at the first sweep (see wake_waiting_steps)

    return wf_store.sweep_stale_steps(
        older_than_seconds, build_job=build_step_job, namespace=namespace
    )


def cancel_orphaned_children(older_than_seconds: float, namespace: str) -> list[int]:
    """Child runs whose parent step no longer waits for them are cancelled."""
    return wf_store.cancel_orphaned_children(older_than_seconds, namespace=namespace)


def connect() -> None:
    """Plug workflows in: publishes wake waiting steps, reclaims sweep stale steps and orphans.

    Idempotent: ``ready()`` may run more than once in a process.
    """
    events.on_publish(wake_waiting_steps)
    for sweep in (sweep_stale_steps, cancel_orphaned_children):
        if sweep not in RECLAIM_SWEEPS:
            RECLAIM_SWEEPS.append(sweep)
