"""Is this host's worker alive? For liveness probes (Kubernetes, systemd, load balancers).

Healthy means: the database answers, at least one worker of the host has a
heartbeat newer than ``max_age`` seconds, and no worker of the host that is
still running has fallen silent. A worker heartbeats every
``HEARTBEAT_INTERVAL`` whatever its jobs do (task code runs on other
threads), so a silent worker is a stuck or frozen process (SIGSTOP, a
control loop blocked on a dead connection, a host under swap), the case a
probe must catch.

The worker table keeps the row of a worker that died (SIGKILL, OOM) until
the leader deletes it ``WORKER_STALE_SECONDS`` later. Such a row must not
fail the probe, or a restarted container would be killed again and again:
when checking this very host, a silent row whose process is gone (or whose
pid a live worker now has, as after a container restart) is left out.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime

from ..models import Worker
from ..store import db_alias, db_now

#: Exit status: healthy; unhealthy workers; the database did not answer.
HEALTHY, UNHEALTHY, NO_DATABASE = 0, 1, 2


@dataclass
class Health:
    status: int
    reason: str

    @property
    def healthy(self) -> bool:
        return self.status == HEALTHY


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def check(*, host: str | None = None, max_age: float, min_workers: int = 1) -> Health:
    """Check the workers of ``host`` (default: this machine's hostname)."""
    here = socket.gethostname()
    host = host or here
    db = db_alias()
    try:
        now: datetime = db_now(db)
        rows = list(
            Worker.objects.using(db)
            .filter(hostname=host)
            .order_by("id")
            .values_list("id", "pid", "last_seen_at")
        )
    except Exception as e:  # any driver error: the probe's answer is "no database"
        return Health(NO_DATABASE, f"database {db!r} did not answer: {type(e).__name__}: {e}")
    fresh = [(wid, pid) for wid, pid, seen in rows if (now - seen).total_seconds() <= max_age]
    fresh_pids = {pid for _, pid in fresh}
    silent = []
    for worker_id, pid, seen in rows:
        age = (now - seen).total_seconds()
        if age <= max_age:
            continue
        if host == here and (pid in fresh_pids or not _pid_running(pid)):
            continue  # a dead worker's leftover row
        silent.append(f"{worker_id} (pid {pid}) last heartbeat {age:.1f} s ago")
    if silent:
        return Health(
            UNHEALTHY,
            f"worker(s) of host {host!r} stopped heartbeating (max age {max_age:g} s): "
            + "; ".join(silent),
        )
    if len(fresh) < min_workers:
        return Health(
            UNHEALTHY,
            f"{len(fresh)} worker(s) of host {host!r} heartbeat within {max_age:g} s, "
            f"expected at least {min_workers}",
        )
    return Health(
        HEALTHY, f"{len(fresh)} worker(s) of host {host!r} heartbeat within {max_age:g} s"
    )
