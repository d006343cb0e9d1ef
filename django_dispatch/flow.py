"""Flow control for operators and applications (the public face).

Pausing and resuming are ``services.queues``; what queues look like,
``queries.queues``.
"""

from .queries.queues import GroupAtCap, QueueOverview, groups_at_cap, queue_overview
from .services.queues import MAX_QUEUE_NAME, pause_queue, paused_queues, resume_queue

__all__ = [
    "MAX_QUEUE_NAME",
    "GroupAtCap",
    "QueueOverview",
    "groups_at_cap",
    "pause_queue",
    "paused_queues",
    "queue_overview",
    "resume_queue",
]
