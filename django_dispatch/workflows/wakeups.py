"""Wake the steps waiting on an event, inside the publish that delivers it.

``events.publish`` cannot import workflows (they sit above events: a wait
reads events and takes their lock), so the wake-up is a publish hook:
``connect()``, called from the app's ``ready()``, registers
``wake_waiting_steps`` with ``events.on_publish``. Registered at startup,
it reaches every process that publishes, whether or not it ever imported
a workflow; run in the publish's transaction, under the event-name lock, a
wake-up commits or rolls back with the event itself.
"""

from __future__ import annotations

from ..models import Event
from ..services import events
from ..store import workflows as wf_store


def wake_waiting_steps(db: str, event: Event) -> int:
    """waiting -> ready for every step waiting on ``event``; how many woke."""
    # Imported at the first publish, not at startup: defining ``run_step``
    # needs the TASKS backends, which ``ready()`` must not require.
    from .tasks import build_step_job

    return wf_store.wake_waiting_steps(db, event, build_step_job)


def connect() -> None:
    """Make every publish wake the steps waiting on its event (idempotent)."""
    events.on_publish(wake_waiting_steps)
