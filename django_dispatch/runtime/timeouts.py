"""Timeouts and force-stop: ask a job to stop, wait a grace period, then end it.

A job is *asked to stop* when its attempt runs past its task's ``timeout``,
or when the heartbeat learns that it was cancelled (or taken over) while it
runs: ``context.cancelled`` turns True, ``context.progress()`` raises
``JobCancelled``, an async task's coroutine is cancelled. Until its task code
returns, the worker keeps the job's lease (the heartbeat renews it, whether
the job is still ``running`` or was ``cancelled``), so neither the job's
retry nor the next job of its partition can start: a cancelled or timed-out
job stays its partition's running head.

If the task code returns within ``DISPATCH["TIMEOUT_GRACE"]`` seconds, the
job thread records the outcome itself: ``TaskTimeout`` (retry or fail) for a
timed-out attempt, the release of a cancelled job.

If it does not, a Python thread cannot be killed, so ``rundispatch``
**recycles its process**: it stops claiming, lets the other jobs finish
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
  lets the thread run on, fenced out but free to cause side effects, as
  before; a cancelled thread that ignores the cancel keeps its partition
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
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from inspect import iscoroutinefunction
from typing import IO, TYPE_CHECKING, Any, Literal, NoReturn

from django.tasks import Task

from .. import store
from ..backend import task_for_row
from ..exceptions import TaskTimeout, UnknownTask
from . import completer, executor

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger("django_dispatch.worker")

#: Extra seconds an async task gets past its timeout before the worker asks
#: it to stop from outside (its own asyncio timeout should have fired first).
ASYNC_TIMEOUT_GRACE = 1.0
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


def timeout_of(row: dict[str, Any]) -> float | None:
    """The job's task ``timeout`` in seconds, None without one (or unknown task)."""
    try:
        task = task_for_row(row)
    except UnknownTask:
        return None
    timeout = getattr(task, "timeout", None)
    return None if timeout is None else float(timeout)


def allowance(row: dict[str, Any]) -> float | None:
    """Seconds an attempt may run before it is asked to stop, None: no limit."""
    timeout = timeout_of(row)
    if timeout is None:
        return None
    try:
        is_async = iscoroutinefunction(task_for_row(row).func)
    except UnknownTask:
        is_async = False
    return timeout + ASYNC_TIMEOUT_GRACE if is_async else timeout


def timeout_outcome(claimed: store.ClaimedJob, timeout: float, *, how: str) -> executor.Outcome:
    """The outcome of an attempt that overran its timeout: retry or fail, with ``TaskTimeout``."""
    try:
        task: Task | None = task_for_row(claimed.row)
    except UnknownTask:
        task = None
    exception = TaskTimeout(
        f"{claimed.row['task_path']} ran longer than its timeout of {timeout:g} s; {how}"
    )
    return executor.classify_failure(claimed, exception, task=task)


@dataclass
class Overtime:
    """A job asked to stop whose task code has not returned yet."""

    reason: Literal["timeout", "stop"]  # "stop": cancelled, or lost by this worker
    asked_at: float  # monotonic
    timeout: float = 0.0
    #: The grace period ran out and this worker did what it could without
    #: recycling (or is shutting down, and the shutdown timeout decides).
    given_up: bool = False


Entry = tuple[int, int, str | None]  # job id, lease epoch, partition key


@dataclass
class Handover:
    """What a recycling worker process leaves to the process that replaces it."""

    worker_id: str
    child: int | None = None  # the process's index under --processes
    claimed: int = 0  # jobs claimed so far (for --max-jobs)
    stop: bool = False  # a stop signal arrived: the successor settles, then stops
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
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def hold_stop_signals() -> None:
    """Keep SIGTERM/SIGINT pending (not lost, not fatal) across ``execve``.

    The signal mask and pending signals survive ``execve``; the successor
    releases them with ``release_stop_signals`` once its handlers are in
    place, so a stop request made during the recycle reaches it.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def release_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def exec_successor(handover: Handover) -> NoReturn:
    """Replace this process by a fresh run of the same command line (same PID).

    Every other thread of the process ends here, task code included. The
    successor finds ``handover`` through its environment (``from_environ``)
    and settles it. Call ``hold_stop_signals`` first (and read whether a stop
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


def settle(handover: Handover, *, lease_seconds: float, db: str) -> None:
    """In the successor, before it claims: record what the handover lists.

    Each write is fenced by the predecessor's lease, so a job that was
    finished, cancelled or reclaimed meanwhile is left as it is.
    """
    for job_id, epoch, key in handover.timed_out:
        lease = store.Lease(job_id=job_id, worker_id=handover.worker_id, epoch=epoch)
        _settle_one(lease, key, "timed_out", lease_seconds, db)
    for job_id, epoch, key in handover.stopped:
        lease = store.Lease(job_id=job_id, worker_id=handover.worker_id, epoch=epoch)
        _settle_one(lease, key, "stopped", lease_seconds, db)
    for job_id, epoch, key in handover.released:
        lease = store.Lease(job_id=job_id, worker_id=handover.worker_id, epoch=epoch)
        _settle_one(lease, key, "released", lease_seconds, db)


def _settle_one(
    lease: store.Lease, key: str | None, what: str, lease_seconds: float, db: str
) -> None:
    try:
        claimed = None if what == "stopped" else store.job_claimed_if_leased(lease, db=db)
        if claimed is None:  # cancelled meanwhile (or lost): let go of it
            store.job_ack_cancelled(lease, partition_key=key, db=db)
            logger.info("job %s: let go after the recycle (cancelled or lost)", lease.job_id)
        elif what == "timed_out":
            timeout = timeout_of(claimed.row) or 0.0
            outcome = timeout_outcome(
                claimed, timeout, how="its worker process was recycled to stop it"
            )
            won = completer.persist(claimed, outcome, give_up_after=lease_seconds)
            logger.warning(
                "job %s: timed out; %s",
                lease.job_id,
                "recorded after the recycle" if won else "already finished or lost",
            )
        else:
            row = claimed.row
            released = store.job_release_if_leased(
                lease, attempts=row["attempts"] - 1, worker_ids=row["worker_ids"][:-1], db=db
            )
            logger.warning(
                "job %s: %s",
                lease.job_id,
                "handed back to the queue after the recycle"
                if released
                else "already finished or lost",
            )
    except Exception:
        # Left to the lease's expiry: the leader returns the job to the queue.
        logger.exception("job %s: could not settle it after the recycle", lease.job_id)


def entries(jobs: Iterable[executor.RunningJob]) -> list[Entry]:
    return [(r.claimed.id, r.claimed.lease.epoch, r.claimed.row["partition_key"]) for r in jobs]


class Overseer:
    """Deadlines and stop requests of one worker's running jobs.

    Its state is guarded by the worker's lock. ``in_task`` holds the jobs
    whose thread is inside task code; ``overtime`` the ones among them that
    were asked to stop.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.overtime: dict[int, Overtime] = {}
        self.in_task: set[int] = set()

    # --- job threads ---------------------------------------------------------

    def started(self, running: executor.RunningJob) -> None:
        """Before the task runs: start its clock."""
        limit = allowance(running.claimed.row)
        with self.worker.lock:
            running.deadline = None if limit is None else time.monotonic() + limit
            self.in_task.add(running.claimed.id)

    def returned(self, running: executor.RunningJob) -> Overtime | None:
        """Once the task code returned or raised: whether it had been asked to stop."""
        with self.worker.lock:
            self.in_task.discard(running.claimed.id)
            return self.overtime.pop(running.claimed.id, None)

    # --- control loop --------------------------------------------------------

    def asked_to_stop(self, running: executor.RunningJob, now: float) -> None:
        """The heartbeat found the job cancelled or lost: its grace period starts."""
        job_id = running.claimed.id
        with self.worker.lock:
            if job_id in self.in_task and job_id not in self.overtime:
                self.overtime[job_id] = Overtime(reason="stop", asked_at=now)

    def check(self, now: float) -> None:
        """Ask jobs over their timeout to stop; act on those past the grace period.

        Past the grace period, a worker that can recycle does (see the module
        docstring), unless it is shutting down on a signal: then the end of
        the shutdown timeout records the job and the exit ends its code. A
        worker that cannot recycle (in-process) gives up on a timed-out
        thread: it records the timeout and lets the thread run on, fenced out.
        """
        worker = self.worker
        grace = worker.settings.TIMEOUT_GRACE
        can_recycle = worker.options.recycle
        recycle = can_recycle and worker.signalled_at is None
        with worker.lock:
            overdue = [
                r
                for job_id, r in worker.running.items()
                if job_id in self.in_task
                and job_id not in self.overtime
                and r.deadline is not None
                and now >= r.deadline
            ]
            asked = []
            for running in overdue:
                over = Overtime(
                    reason="timeout", asked_at=now, timeout=timeout_of(running.claimed.row) or 0.0
                )
                self.overtime[running.claimed.id] = over
                asked.append((running, over))
            late = [
                (worker.running[job_id], over)
                for job_id, over in self.overtime.items()
                if not over.given_up and now >= over.asked_at + grace and job_id in worker.running
            ]
            if not recycle:
                for running, over in late:
                    over.given_up = True
                    if over.reason == "timeout" and not can_recycle:
                        running.abandoned = True  # its late result is void
        for running, over in asked:
            running.stop()
            logger.warning(
                "job %s: over its timeout of %s s; asked to stop (grace %s s)",
                running.claimed.id,
                over.timeout,
                grace,
            )
        if not late or worker.recycling:  # already waiting to recycle
            return
        if recycle:
            for running, over in late:
                logger.warning(
                    "job %s: still running %s s after it was asked to stop (%s)",
                    running.claimed.id,
                    grace,
                    "timed out" if over.reason == "timeout" else "cancelled or lost",
                )
            worker.recycle()
            return
        for running, over in late:
            if can_recycle:  # shutting down: the shutdown timeout decides
                logger.warning(
                    "job %s: still running %s s after it was asked to stop; it ends with "
                    "this process at the end of the shutdown",
                    running.claimed.id,
                    grace,
                )
            elif over.reason == "timeout":
                worker.give_up(running, over)
            else:
                logger.warning(
                    "job %s: still running %s s after it was cancelled; this process "
                    "cannot end it (see docs/tasks.md#timeouts)",
                    running.claimed.id,
                    grace,
                )
