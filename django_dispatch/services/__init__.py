"""Operator and application commands, each checking the state it acts on.

Each returns whether this call made the change (GoodJob's shape): an admin
action reports "3 cancelled, 1 skipped (already finished)" from it. The
commands on jobs, dead letters and cron entries are ``services.jobs``; on
queues, ``services.queues``. ``django_dispatch.services`` is their
documented path.
"""

from ..tasks.enqueue import enqueue_many
from .jobs import (
    cancel,
    cron_task,
    delete_cron_entries,
    delete_dead_letters,
    delete_finished_jobs,
    purge,
    replay,
    retry_now,
    run_cron_entry_now,
    set_cron_enabled,
)
from .queues import pause_queue, paused_queues, resume_queue

__all__ = [
    "cancel",
    "cron_task",
    "delete_cron_entries",
    "delete_dead_letters",
    "delete_finished_jobs",
    "enqueue_many",
    "pause_queue",
    "paused_queues",
    "purge",
    "replay",
    "resume_queue",
    "retry_now",
    "run_cron_entry_now",
    "set_cron_enabled",
]
