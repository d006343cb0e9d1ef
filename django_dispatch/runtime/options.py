"""What a worker is told when it starts, and the shape of its periodic duties."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .recycling import Handover


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


@dataclass
class WorkerOptions:
    worker_id: str
    queues: Sequence[str] = ()
    #: The namespace served (``rundispatch --backend``: that alias's
    #: ``OPTIONS["NAMESPACE"]``): claims, reclaims, purges, cron, leadership
    #: and wake-ups all stay inside it.
    namespace: str = ""
    concurrency: int = 4
    #: Slots for ``async def`` jobs on one event loop (``asyncjobs``); 0: none,
    #: async jobs take a job thread each.
    async_concurrency: int = 0
    burst: bool = False
    max_jobs: int | None = None
    shutdown_timeout: float = 30.0
    scheduler: bool = True  # run the cron scheduler (--no-scheduler turns it off)
    #: End task code that ignores a stop request by recycling the process
    #: (``rundispatch`` only: see ``recycling.can_recycle``).
    recycle: bool = False
    #: What the process this one replaced left to settle (see ``recycling``).
    predecessor: Handover | None = None
    #: This process's capacity (``--capacity``, divided among ``--processes``)
    #: and locality. Neither: the claim ignores resource needs.
    capacity: dict[str, int] = field(default_factory=dict)
    locality: str = ""
    #: The ``--processes`` supervisor this process is a child of: if it is
    #: gone (SIGKILL, the OOM killer), the child stops as on SIGTERM rather
    #: than live on as an orphan that no restart, stop or deploy reaches.
    supervisor_pid: int | None = None


class Every:
    """A duty of the control loop, run every ``interval`` seconds."""

    def __init__(self, interval: float, run: Callable[[], object], *, start_now: bool = True):
        self.interval = interval
        self.run = run
        self.next_at = time.monotonic() + (0.0 if start_now else interval)

    def due(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.next_at = now + self.interval
        return True
