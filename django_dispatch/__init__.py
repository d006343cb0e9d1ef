"""Durable background jobs for Django's Tasks framework.

The public entry points are imported lazily so that ``import django_dispatch``
works before Django's app registry is ready (e.g. from settings modules).
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from .exceptions import AlreadyReplayed, ArtifactExists, JobCancelled, TaskTimeout

try:
    __version__ = _version("django-dispatch")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AlreadyReplayed",
    "ArtifactExists",
    "JobCancelled",
    "TaskTimeout",
    "__version__",
    "cancel",
    "dead_letters",
    "enqueue_many",
    "jobs",
    "pause_queue",
    "paused_queues",
    "replay",
    "resume_queue",
    "retry_now",
    "run_now",
    "schedules",
    "task",
]

if TYPE_CHECKING:
    from . import dead_letters, jobs, schedules
    from ._typing import task
    from .flow import pause_queue, paused_queues, resume_queue
    from .runtime.run_now import run_now
    from .services import cancel, replay, retry_now
    from .tasks.enqueue import enqueue_many


def __getattr__(name: str) -> Any:
    if name in {"jobs", "dead_letters", "schedules"}:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name == "run_now":
        # Imported on first use: only run_now needs the worker machinery.
        from .runtime.run_now import run_now

        return run_now
    if name == "enqueue_many":
        from .tasks.enqueue import enqueue_many

        return enqueue_many
    if name in {"cancel", "replay", "retry_now"}:
        from . import services

        return getattr(services, name)
    if name in {"pause_queue", "resume_queue", "paused_queues"}:
        from . import flow

        return getattr(flow, name)
    if name == "task":
        # Django's @task, taking our options on every supported Django (see compat).
        from .compat import task_with_options

        return task_with_options
    raise AttributeError(f"module 'django_dispatch' has no attribute {name!r}")
