"""A worker started under the id of a dead incarnation takes that incarnation's jobs back.

``rundispatch --worker-id ID`` gives a worker a stable identity (a host name,
a StatefulSet pod, a systemd instance). When the process under that id dies
(SIGKILL, the OOM killer, a crash) its jobs stay ``running`` under its
lease until the lease expires, and only then does the leader's reclaim
return them: a restart would wait out a whole lease for its own jobs.
Instead, before it claims anything, a worker looks at the row registered
under its id:

- no row: nothing to take back (a clean stop deregisters and hands its jobs
  back; a row deleted as stale belongs to leases long since reclaimed);
- its own process (an earlier worker object of this very process registered
  it): nothing to take back;
- a *dead* incarnation, i.e. same host and its pid is gone, a zombie, or now
  another process (this one, or one younger than the registration: a
  restarted container reuses pids, ``rundispatch`` often pid 1 again), or a
  heartbeat older than ``STALE_HEARTBEATS`` heartbeat intervals: the
  worker takes the id over, then takes back every job still held under it,
  through the reclaim's own store path (``jobs_rescue_expired(held_by=)``):
  each attempt is recorded as lost (a ``WorkerLost`` error, epoch bumped,
  ``worker_lost_count``, the usage record 'worker_lost'), and the job goes
  back to the queue, or fails for good after ``MAX_WORKER_LOST`` losses;
- a *live* one: the worker refuses to start (``WorkerIdInUse``): two
  processes under one id would each look like the holder of the other's jobs.

Taking the id is a compare-and-set on the row (``worker_take_id``), so of
two processes started under one id at once, one wins and the other finds it
alive. An incarnation judged dead by its heartbeat alone (another host)
that was only frozen is fenced out by the epoch bump, as after a reclaim.
A recycled worker (``predecessor``) is the same process going on under its
id; ``recycling.settle`` settles its jobs instead.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from django.core.management import CommandError

from .. import store
from ..conf import DispatchSettings
from ..observability import joblog
from ..store.workers import Incarnation, WorkerIdTaken, worker_incarnation, worker_take_id
from .connections import ride_out
from .options import WorkerOptions

logger = logging.getLogger("django_dispatch.worker")

#: An incarnation whose heartbeat is older than this many heartbeat intervals
#: is dead. ``LEASE_SECONDS`` is at least three intervals (``conf``), so this
#: is never later than the lease's own expiry.
STALE_HEARTBEATS = 3
#: A process at the registered pid that started this much later than the
#: registration (two durations, each on one clock: the host's since its boot,
#: the database's since the registration) is another process.
PID_REUSE_MARGIN = 2.0
#: The worker ids this process registered (``take_id``): its own, whatever
#: its pid says. Same host and pid alone cannot tell: a container restarted
#: under its old hostname runs ``rundispatch`` as the same pid again.
_REGISTERED: set[str] = set()
#: Tries of the compare-and-set before giving up to a process that keeps
#: taking the id at the same moment.
TAKE_ATTEMPTS = 3


class WorkerIdInUse(CommandError):
    """A live worker holds the id this one was started under (a ``CommandError``:
    ``rundispatch`` prints it and exits 1, without a traceback)."""


def registration(options: WorkerOptions, db: str) -> dict[str, Any]:
    """The worker row's description of this process (``store.worker_register``)."""
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "queues": options.queues,
        "concurrency": options.concurrency + options.async_concurrency,
        "db": db,
        "namespace": options.namespace,
        "capacity": options.capacity,
        "locality": options.locality,
    }


def take_id(
    options: WorkerOptions, registration: Mapping[str, Any], settings: DispatchSettings
) -> int:
    """Register this process under ``options.worker_id``; return how many jobs of a
    dead incarnation it took back. Raises ``WorkerIdInUse`` while a live one holds it.

    Two steps, each tried again after a database error on its own: taking the
    id, then taking back the dead incarnation's jobs (a retry of which finds
    the ones already taken back gone). A retry of the first that finds the id
    already this process's (the compare-and-set committed, its reply lost)
    takes back from the incarnation it replaced."""
    if options.predecessor is not None:
        return 0
    worker_id, db = options.worker_id, registration["db"]
    tried: list[Incarnation | None] = []  # the incarnation the last compare-and-set replaced
    previous = _riding_out(lambda: _take_id(worker_id, registration, settings, tried))
    if previous is None:
        return 0
    return _riding_out(lambda: _take_back(worker_id, previous, settings, db))


def _take_id(
    worker_id: str,
    registration: Mapping[str, Any],
    settings: DispatchSettings,
    tried: list[Incarnation | None],
) -> Incarnation | None:
    """Take the id; the dead incarnation it was taken from (None: none, or this process's)."""
    stale = STALE_HEARTBEATS * settings.HEARTBEAT_INTERVAL
    for _ in range(TAKE_ATTEMPTS):
        previous = worker_incarnation(worker_id, db=registration["db"])
        if tried and previous is not None and _here(previous):
            _REGISTERED.add(worker_id)  # a retry: the last compare-and-set committed
            return tried[-1]
        ours = previous is not None and _ours(worker_id, previous)
        if previous is not None and not ours and not _dead(previous, stale):
            raise WorkerIdInUse(_in_use(worker_id, previous, stale))
        tried.append(None if ours else previous)
        if worker_take_id(worker_id, previous, **registration):
            _REGISTERED.add(worker_id)
            return tried[-1]
    raise WorkerIdInUse(
        f"--worker-id {worker_id!r}: another process kept registering under this id "
        "while this one started. Start one worker per id."
    )


def register(worker_id: str, registration: Mapping[str, Any]) -> str | None:
    """Refresh this incarnation's row as the worker starts; None, or why it must stop.

    Another process may have taken the id over since ``take_id`` (this one
    judged dead: frozen, or its heartbeat late, right after taking it). The
    refresh is then refused (``WorkerIdTaken``) and this process stops before
    it claims anything, leaving the new owner's row as it is.
    """
    try:
        _riding_out(lambda: store.worker_register(worker_id, **registration))
    except WorkerIdTaken as e:
        logger.error("%s; this process stops", e, extra=joblog.worker_fields(worker_id))
        return str(e)
    return None


def _riding_out[T](step: Callable[[], T]) -> T:
    """``step``, tried again after a database error: a connection cut as the
    worker starts (a failover, a pooler's restart) is ridden out, as the
    control loop rides it out later. Each step is safe to repeat: a write
    whose reply was lost is found done by the next try."""
    return ride_out(step, while_="as the worker starts")


def _take_back(worker_id: str, previous: Incarnation, settings: DispatchSettings, db: str) -> int:
    """Rescue every job still held under the id, as the reclaim rescues expired ones."""
    max_lost = settings.MAX_WORKER_LOST

    def report(row: Mapping[str, Any], failed: bool) -> None:
        joblog.worker_lost(row, failed=failed, max_worker_lost=max_lost, by=worker_id)

    taken = 0
    while True:
        requeued, failed = store.jobs_rescue_expired(
            max_worker_lost=max_lost,
            db=db,
            report=report,
            namespace=previous.namespace,
            held_by=worker_id,
        )
        if not requeued and not failed:
            break
        taken += len(requeued) + len(failed)
    logger.log(
        logging.WARNING if taken else logging.INFO,
        "worker %s: its previous incarnation (pid %s on %s) is gone; took back %s running "
        "jobs at once",
        worker_id,
        previous.pid,
        previous.hostname,
        taken,
        extra=joblog.worker_fields(worker_id),
    )
    return taken


def _ours(worker_id: str, previous: Incarnation) -> bool:
    return worker_id in _REGISTERED and _here(previous)


def _here(previous: Incarnation) -> bool:
    """Whether the row names this process (its host and pid)."""
    return previous.hostname == socket.gethostname() and previous.pid == os.getpid()


def _dead(previous: Incarnation, stale: float) -> bool:
    if previous.seen_ago > stale:
        return True
    if previous.hostname != socket.gethostname():
        return False  # another host's process: only its heartbeat tells
    if previous.pid == os.getpid():  # not ours (``_ours``): that process is gone
        return True
    if not _pid_alive(previous.pid):
        return True
    younger = _process_age(previous.pid)
    return younger is not None and younger + PID_REUSE_MARGIN < previous.age


def _process_age(pid: int) -> float | None:
    """Seconds since process ``pid`` started (from /proc: its start since boot,
    and the uptime, both on this host's clock); None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            started = int(stat.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as uptime:
            up = float(uptime.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return up - started / os.sysconf("SC_CLK_TCK")


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (a zombie does not: it has exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): trust kill()
        return True


def _in_use(worker_id: str, previous: Incarnation, stale: float) -> str:
    return (
        f"--worker-id {worker_id!r} is in use: a live worker runs under it (pid "
        f"{previous.pid} on host {previous.hostname}, heartbeat {previous.seen_ago:.1f} s ago). "
        "Two processes must not share a worker id: each would look like the holder of the "
        "other's jobs. Stop that worker first, or give this one another --worker-id. (A "
        "worker counts as gone once its process has exited, on the same host, or once its "
        f"heartbeat is older than {stale:g} s.)"
    )
