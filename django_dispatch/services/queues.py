"""Pausing and resuming queues: commands that check the queue they act on.

``pause_queue(name)`` stops new starts of the queue's jobs on every worker of
the namespace (within one poll interval; at once on PostgreSQL with LISTEN),
while running jobs finish and enqueue keeps working; ``resume_queue(name)``
lets the backlog drain. The state is a database row, so it holds across
restarts and hosts. The namespace is that of a TASKS alias (``backend``,
default ``"default"``), as for ``drain()`` and ``rundispatch --backend``.
"""

from __future__ import annotations

from .. import store
from ..runtime.flow_cache import forget_paused
from ..store import flow as flow_store
from ..tasks.registry import backend_for, namespace_of

#: Longest queue name (``Job.queue_name``).
MAX_QUEUE_NAME = 100


def _checked(name: object, backend: str | None, *, listed: bool = True) -> str:
    """``name`` if it can be a queue of ``backend``; a ValueError saying why not otherwise.

    With ``listed`` (pausing), a backend whose ``QUEUES`` lists its queues
    accepts only those: pausing a misspelt name would silently pause nothing.
    """
    if not isinstance(name, str) or not name or len(name) > MAX_QUEUE_NAME:
        raise ValueError(
            f"queue name must be a non-empty string of at most {MAX_QUEUE_NAME} "
            f"characters, got {name!r}."
        )
    if not listed:
        return name
    dispatch_backend = backend_for(backend or "default")
    allowed = getattr(dispatch_backend, "queues", None)
    if allowed and name not in allowed:
        raise ValueError(
            f"queue {name!r} is not one of TASKS[{backend or 'default'!r}]['QUEUES'] "
            f"({sorted(allowed)}); pause one of those."
        )
    return name


def pause_queue(name: str, *, backend: str | None = None) -> bool:
    """Pause queue ``name``: True only when this call paused it (False: it already was).

    Its jobs stay pending and keep being enqueued; none starts until
    ``resume_queue``. Jobs already running finish. Runs in the caller's
    transaction if there is one (the pause takes effect at its commit).
    """
    name = _checked(name, backend)
    paused = flow_store.queue_pause(
        store.database_for(backend), name, namespace=namespace_of(backend)
    )
    if paused:  # this process's workers see it at their next claim
        forget_paused()
    return paused


def resume_queue(name: str, *, backend: str | None = None) -> bool:
    """Resume queue ``name``: True only when this call resumed it (False: it was not paused).

    Any paused name is accepted, listed in ``TASKS[...]["QUEUES"]`` or not:
    a deploy may drop a queue that was paused, and its pause row must still
    be removable (else its jobs never start). Deleting a row that exists is
    always safe; a misspelt name resumes nothing and says so (False).
    """
    name = _checked(name, backend, listed=False)
    resumed = flow_store.queue_resume(
        store.database_for(backend), name, namespace=namespace_of(backend)
    )
    if resumed:  # this process's workers see it at their next claim
        forget_paused()
    return resumed


def paused_queues(*, backend: str | None = None) -> set[str]:
    """The names of the paused queues (read from the database now)."""
    return flow_store.queues_paused(store.database_for(backend), namespace=namespace_of(backend))
