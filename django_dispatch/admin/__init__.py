"""django_dispatch's admin pages, one module per model.

Operators see jobs, dead letters, cron entries, workers and workflow runs.
Every change of job, dead-letter, schedule or workflow state is made by a
service (``services.py``, ``workflows/services.py``), never by the admin
itself, so the admin obeys the same state guards as the rest of the code.
Actions a user may not take are not offered:

* ``django_dispatch.cancel_job``: cancel jobs;
* ``django_dispatch.retry_job``: retry jobs now (failed ones: replay their dead letter);
* ``django_dispatch.replay_deadletter``: replay dead letters, with corrected arguments too;
* the models' ``view``/``change``/``delete`` permissions as usual.
"""

from .artifacts import ArtifactAdmin
from .cron import CronEntryAdmin
from .dead_letters import DeadLetterAdmin
from .events import EventAdmin
from .jobs import JobAdmin
from .queues import QueueAdmin
from .usage import JobUsageAdmin
from .workers import WorkerAdmin
from .workflow_steps import WorkflowTaskAdmin
from .workflows import WorkflowRunAdmin

__all__ = [
    "ArtifactAdmin",
    "CronEntryAdmin",
    "DeadLetterAdmin",
    "EventAdmin",
    "JobAdmin",
    "JobUsageAdmin",
    "QueueAdmin",
    "WorkerAdmin",
    "WorkflowRunAdmin",
    "WorkflowTaskAdmin",
]
