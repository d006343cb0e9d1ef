"""Recycling a worker process to end task code that ignores a stop request.

A job asked to stop (``timeouts``) whose task code does not return within
the grace period cannot be ended from inside: a Python thread cannot be
killed. So ``rundispatch`` **recycles its process**: it stops claiming, lets the other jobs finish
(up to the shutdown timeout), writes the successes already returned, renews
every lease it holds once more, lists each running job in a ``Handover``
(passed on in an unnamed temporary file, whatever its size) and re-executes
its own command line with ``os.execve`` (the same PID, so systemd and the
``--processes`` supervisor keep their worker).
``execve`` ends every thread of the process, the zombie's included, before
the new program starts. Only then does the new process (the *successor*),
before it claims anything, settle the handover through the lease fence:
records ``TaskTimeout`` for the timed-out jobs, lets go of the cancelled
ones, and hands the others back without spending an attempt.

The guarantee: while any code of an attempt may still run, its job's lease
is held, so its retry and the next job of its partition cannot start. The
only writes that free the job come from its own thread after its task code
returned, or from the successor after ``execve``. There is no overlap
window. What remains:

- The successor must settle within ``LEASE_SECONDS`` of the last renewal
  (Django's start-up, a few queries). If it does not (the machine is that
  slow, or ``execve`` failed and the process exited), the leases expire and
  the leader returns the jobs to the queue as ``WorkerLost``: still no
  overlap, since the old code is dead, but the timeout is recorded as a lost
  worker.
- Jobs handed back by a recycle are re-run from their last checkpoint (no
  attempt spent); a job that saves no checkpoint starts over.
- Only a process started as ``rundispatch`` from its command line recycles
  (re-executing any other command line, a test runner's for instance, would
  be wrong: see ``can_recycle``). A ``Worker``
  run in-process (``testing.drain()``, ``call_command``) falls back to giving
  up on a timed-out thread after the grace period: it records the timeout and
  lets the thread run on, fenced out but free to cause side effects; a
  cancelled thread that ignores the cancel keeps its partition
  until it returns.
- During a graceful shutdown (SIGTERM/SIGINT) the shutdown timeout applies
  instead: at its end, unfinished jobs are recorded (timeout) or handed back,
  and the process exits a few milliseconds later, ending the code still
  running; in that short window the job may already be claimed elsewhere.
- A job reclaimed from this worker because it missed its heartbeats (a
  frozen or partitioned process) may already run elsewhere when the
  heartbeat learns it: its code here is then asked to stop and ended after
  the grace period, which shortens that overlap but cannot prevent it.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, NoReturn

from .. import store
from ..compat import Task
from ..exceptions import UnknownTask
from ..tasks.task import task_for_row, timeout_of
from . import completer
from .running import RunningJob
from .timeouts import timeout_outcome

logger = logging.getLogger("django_dispatch.worker")

#: The environment variable telling the successor process where its
#: ``Handover`` is: ``"<fd>:<pid>"``, a file descriptor inherited across
#: ``execve`` by the process ``pid`` (see ``Handover.pass_on``).
HANDOVER_ENV = "DISPATCH_HANDOVER"


def can_recycle(argv: Sequence[str] | None) -> bool:
    """Whether this process may replace itself by re-executing its command line.

    ``argv`` is the command line Django's entry point (``manage.py``,
    ``django-admin``, ``python -m django``) handed to ``rundispatch``
    (``BaseCommand.run_from_argv``), None when the command was called from
    code (``call_command``). Only when that is this process's own command
    line does re-executing it bring the same worker back. Not when a test
    runner or a script runs the command: ``pytest -k rundispatch`` has the
    word in its arguments, but re-executing it would rerun the tests. The
    successor re-executes the same command line, so it decides the same way.
    """
    return hasattr(os, "execve") and argv is not None and list(argv) == sys.argv


Entry = tuple[int, int, str | None]  # job id, lease epoch, partition key


@dataclass
class Handover:
    """What a recycling worker process leaves to the process that replaces it."""

    worker_id: str
    child: int | None = None  # the process's index under --processes
    claimed: int = 0  # jobs claimed so far (for --max-jobs)
    stop: bool = False  # a stop signal arrived: the successor settles, then stops
    #: The read end of the predecessor's ``StopSignalLog``, inherited across execve.
    stop_log: int | None = None
    timed_out: list[Entry] = field(default_factory=list)
    stopped: list[Entry] = field(default_factory=list)  # cancelled or lost
    released: list[Entry] = field(default_factory=list)  # handed back

    def dumps(self) -> str:
        return json.dumps(
            {
                "worker_id": self.worker_id,
                "child": self.child,
                "claimed": self.claimed,
                "stop": self.stop,
                "stop_log": self.stop_log,
                "timed_out": self.timed_out,
                "stopped": self.stopped,
                "released": self.released,
            },
            separators=(",", ":"),
        )

    @classmethod
    def loads(cls, text: str) -> Handover:
        data = json.loads(text)

        def entries(name: str) -> list[Entry]:
            return [(int(i), int(e), k) for i, e, k in data.get(name, [])]

        return cls(
            worker_id=data["worker_id"],
            child=data.get("child"),
            claimed=int(data.get("claimed", 0)),
            stop=bool(data.get("stop", False)),
            stop_log=None if data.get("stop_log") is None else int(data["stop_log"]),
            timed_out=entries("timed_out"),
            stopped=entries("stopped"),
            released=entries("released"),
        )

    def pass_on(self) -> tuple[IO[bytes], str]:
        """Write this handover for the successor: (the open file, the value for ``HANDOVER_ENV``).

        Not in the environment itself: one environment variable is limited
        to 128 KiB on Linux (``execve`` fails with E2BIG), which a worker
        with many threads running jobs with long partition keys exceeds. An
        unnamed temporary file instead (``TemporaryFile``: created 0600 and
        unlinked at once, so nobody else can open it and nothing is left on
        disk whatever happens to either process) whose descriptor survives
        ``execve``; only its number travels in the environment. Keep the
        file object open until ``execve``.
        """
        handle = tempfile.TemporaryFile(prefix="dispatch-handover-")  # noqa: SIM115 - see above
        handle.write(self.dumps().encode())
        handle.flush()
        os.set_inheritable(handle.fileno(), True)
        return handle, f"{handle.fileno()}:{os.getpid()}"

    @classmethod
    def from_environ(cls) -> Handover | None:
        """The handover left by the process this one replaced, if any.

        The variable is removed from the environment (a task's subprocess
        must not take it for its own) and the descriptor is closed once read,
        which frees the file. A value left for another process (its pid is
        not ours: ``execve`` keeps the pid, anything else changes it) or
        naming no regular file is ignored, with an error in the log.
        """
        value = os.environ.pop(HANDOVER_ENV, None)
        if not value:
            return None
        try:
            fd_text, pid_text = value.split(":")
            fd, pid = int(fd_text), int(pid_text)
        except ValueError:
            logger.error("ignoring %s=%r: expected '<fd>:<pid>'", HANDOVER_ENV, value)
            return None
        if pid != os.getpid():
            logger.error(
                "ignoring %s=%r: it was left for process %s, not this one (%s)",
                HANDOVER_ENV,
                value,
                pid,
                os.getpid(),
            )
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"descriptor {fd} is not a regular file")
            with os.fdopen(fd, "rb") as handle:
                handle.seek(0)
                return cls.loads(handle.read().decode())
        except (OSError, ValueError, KeyError, TypeError):
            logger.exception("ignoring an unreadable handover (%s=%r)", HANDOVER_ENV, value)
            return None

    def jobs(self) -> int:
        return len(self.timed_out) + len(self.stopped) + len(self.released)


#: Where ``rundispatch`` started: its command line may name a script
#: relative to it, and a task may have changed directory since.
START_DIRECTORY = os.getcwd()


def exec_successor(handover: Handover) -> NoReturn:
    """Replace this process by a fresh run of the same command line (same PID).

    Every other thread of the process ends here, task code included. The
    successor finds ``handover`` through its environment (``from_environ``)
    and settles it. Call ``stop_signals.hold_stop_signals`` first (and read whether a stop
    was requested after it), so that no stop request falls between the two
    programs.
    """
    os.chdir(START_DIRECTORY)
    argv = [sys.executable, *sys.orig_argv[1:]]
    logger.warning(
        "recycling the worker process (pid %s) to end task code that did not stop; "
        "%s job(s) handed over to its successor",
        os.getpid(),
        handover.jobs(),
    )
    try:
        _handle, where = handover.pass_on()  # the file stays open until execve
        env = {**os.environ, HANDOVER_ENV: where}
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.execve(sys.executable, argv, env)
    except OSError:
        # The process must end anyway: the leases expire and the leader
        # returns the jobs to the queue (as lost workers).
        logger.exception("could not re-execute %s; exiting", argv)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(1)


def settle(handover: Handover, *, lease_seconds: float, db: str, namespace: str = "") -> None:
    """In the successor, before it claims: record what the handover lists.

    Each write is fenced by the predecessor's lease, so a job that was
    finished, cancelled or reclaimed meanwhile is left as it is.
    """
    for what, entries_ in (
        ("timed_out", handover.timed_out),
        ("stopped", handover.stopped),
        ("released", handover.released),
    ):
        for job_id, epoch, key in entries_:
            lease = store.Lease(
                job_id=job_id,
                worker_id=handover.worker_id,
                epoch=epoch,
                partition_key=key,
                namespace=namespace,
            )
            _settle_one(lease, key, what, lease_seconds, db)


def _settle_one(
    lease: store.Lease, key: str | None, what: str, lease_seconds: float, db: str
) -> None:
    try:
        claimed = None if what == "stopped" else store.job_claimed_if_leased(lease, db=db)
        if claimed is None:  # cancelled meanwhile (or lost): let go of it
            completer.let_go(lease, key, db=db)
            logger.info("job %s: let go after the recycle (cancelled or lost)", lease.job_id)
        elif what == "timed_out":
            try:
                task: Task | None = task_for_row(claimed.row)
            except UnknownTask:
                task = None
            outcome = timeout_outcome(
                claimed,
                timeout_of(task) or 0.0,
                how="its worker process was recycled to stop it",
                task=task,
            )
            completer.persist(claimed, outcome, give_up_after=lease_seconds)  # logs it
        else:
            completer.release(claimed, why="handed back after its worker's recycle", db=db)
    except Exception:
        # Left to the lease's expiry: the leader returns the job to the queue.
        logger.exception("job %s: could not settle it after the recycle", lease.job_id)


def handover_of(
    worker_id: str, claimed: int, jobs: list[RunningJob], *, timed_out: set[int]
) -> Handover:
    """The handover listing ``jobs``: timed out, stopped (cancelled or lost), or to hand back."""
    rest = [r for r in jobs if r.claimed.id not in timed_out]
    return Handover(
        worker_id=worker_id,
        claimed=claimed,
        timed_out=entries(r for r in jobs if r.claimed.id in timed_out),
        stopped=entries(r for r in rest if r.cancel_event.is_set()),
        released=entries(r for r in rest if not r.cancel_event.is_set()),
    )


def entries(jobs: Iterable[RunningJob]) -> list[Entry]:
    return [(r.claimed.id, r.claimed.lease.epoch, r.claimed.row["partition_key"]) for r in jobs]
