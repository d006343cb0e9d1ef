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

If it does not, ``rundispatch`` recycles its process (``recycling``). This
module only *detects*: ``Overseer.check`` returns what to do, and the worker
acts on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from inspect import iscoroutinefunction
from typing import Literal

from .. import store
from ..compat import Task
from ..core.docs_links import docs_url
from ..exceptions import TaskTimeout
from ..observability import joblog
from ..tasks.task import timeout_of
from .attempt import fail
from .executor import Outcome
from .running import RunningJob

logger = logging.getLogger("django_dispatch.worker")

#: The job this thread runs, as (overseer, running job): see ``limit_this_job``.
_current = threading.local()

#: Extra seconds an async task gets past its timeout before the worker asks
#: it to stop from outside (its own asyncio timeout should have fired first).
ASYNC_TIMEOUT_GRACE = 1.0


def allowance(task: Task | None) -> float | None:
    """Seconds an attempt of ``task`` may run before it is asked to stop, None: no limit."""
    timeout = timeout_of(task)
    if timeout is None or task is None:
        return None
    return timeout + ASYNC_TIMEOUT_GRACE if iscoroutinefunction(task.func) else timeout


def timeout_outcome(
    claimed: store.ClaimedJob, timeout: float, *, how: str, task: Task | None
) -> Outcome:
    """The outcome of an attempt that overran its timeout: retry or fail, with ``TaskTimeout``.

    ``task`` is the job's Task (None: its row names none that imports).
    """
    exception = TaskTimeout(
        f"{claimed.row['task_path']} ran longer than its timeout of {timeout:g} s; {how}"
    )
    return fail(claimed, exception, task=task)


@dataclass
class Overtime:
    """A job asked to stop whose task code has not returned yet."""

    reason: Literal["timeout", "stop"]  # "stop": cancelled, or lost by this worker
    asked_at: float  # monotonic
    timeout: float = 0.0
    #: The grace period ran out and this worker did what it could without
    #: recycling (or is shutting down, and the shutdown timeout decides).
    given_up: bool = False


Late = list[tuple[RunningJob, Overtime]]


@dataclass
class Verdict:
    """What ``Overseer.check`` found; the worker acts on it."""

    #: Over their timeout just now: ask each to stop.
    asked: Late = field(default_factory=list)
    #: Asked to stop a grace period ago and still in task code.
    late: Late = field(default_factory=list)
    #: The late ones are ended by recycling the process (else: each by itself,
    #: see ``act``).
    recycle: bool = False
    grace: float = 0.0  # seconds a job asked to stop may take
    can_recycle: bool = False  # this process could recycle (``rundispatch``)


class Overseer:
    """Deadlines and stop requests of one worker's running jobs.

    It shares the worker's lock (given, not reached for), under which the
    worker's table of running jobs changes too, so that a job cannot return
    between being found late and being acted on. ``in_task`` holds the jobs
    whose thread is inside task code; ``overtime`` the ones among them that
    were asked to stop.
    """

    def __init__(self, lock: threading.Lock, grace: float) -> None:
        self.lock = lock
        self.grace = grace
        self.overtime: dict[int, Overtime] = {}
        self.in_task: set[int] = set()
        #: Time limits set from inside a job (``limit_this_job``), by job id.
        self.limits: dict[int, float] = {}
        #: Whether this worker's process can recycle (as ``check`` last heard).
        self.can_recycle = False

    # --- job threads ---------------------------------------------------------

    def started(self, running: RunningJob) -> None:
        """Before the task runs: start its clock."""
        limit = allowance(running.task)  # resolved by the job runner (``attempt.resolve``)
        with self.lock:
            running.deadline = None if limit is None else time.monotonic() + limit
            self.in_task.add(running.claimed.id)
        _current.job = (self, running)

    def returned(self, running: RunningJob) -> Overtime | None:
        """Once the task code returned or raised: whether it had been asked to stop."""
        _current.job = None
        with self.lock:
            self.in_task.discard(running.claimed.id)
            self.limits.pop(running.claimed.id, None)
            return self.overtime.pop(running.claimed.id, None)

    # --- control loop --------------------------------------------------------

    def asked_to_stop(self, running: RunningJob, now: float) -> None:
        """The heartbeat found the job cancelled or lost: its grace period starts."""
        job_id = running.claimed.id
        with self.lock:
            if job_id in self.in_task and job_id not in self.overtime:
                self.overtime[job_id] = Overtime(reason="stop", asked_at=now)

    def check(
        self,
        now: float,
        jobs: Mapping[int, RunningJob],
        can_recycle: bool,
        shutting_down: bool,
    ) -> Verdict:
        """Find jobs over their timeout, and those still running past the grace period.

        ``jobs`` is the worker's table of running jobs (read under the shared
        lock). Past the grace period, a worker that can recycle does, unless
        it is shutting down on a signal: then the end of the shutdown timeout
        records the job and the exit ends its code. A worker that cannot
        recycle (in-process) gives up on a timed-out thread: its late result
        is void (``abandoned``), and the worker records the timeout.
        """
        self.can_recycle = can_recycle
        recycle = can_recycle and not shutting_down
        verdict = Verdict(recycle=recycle, grace=self.grace, can_recycle=can_recycle)
        with self.lock:
            for job_id, running in jobs.items():
                deadline = running.deadline
                overdue = deadline is not None and now >= deadline
                if overdue and job_id in self.in_task and job_id not in self.overtime:
                    timeout = self.limits.get(job_id) or timeout_of(running.task) or 0.0
                    over = Overtime(reason="timeout", asked_at=now, timeout=timeout)
                    self.overtime[job_id] = over
                    verdict.asked.append((running, over))
            verdict.late = [
                (jobs[job_id], over)
                for job_id, over in self.overtime.items()
                if not over.given_up and now >= over.asked_at + self.grace and job_id in jobs
            ]
            if not recycle:
                for running, over in verdict.late:
                    over.given_up = True
                    if over.reason == "timeout" and not can_recycle:
                        running.abandoned = True  # its late result is void
        return verdict


def limit_this_job(seconds: float) -> bool:
    """End the job this thread runs after ``seconds``, as a task's own timeout would.

    For code that learns its time limit only once it runs: a workflow step
    (the step job's task has none; the step row has its own). Past the limit
    the job is asked to stop (``cancelled`` turns True), and if its code
    has not returned ``TIMEOUT_GRACE`` seconds later, ``rundispatch``
    recycles the process, ending it. False, changing nothing, when this
    thread runs no job of a worker process that can recycle (in-process
    workers, ``drain()``): the caller must enforce the limit itself.
    """
    current = getattr(_current, "job", None)
    if current is None:
        return False
    overseer, running = current
    with overseer.lock:
        if not overseer.can_recycle:
            return False
        overseer.limits[running.claimed.id] = seconds
        running.deadline = time.monotonic() + seconds
    return True


def act(
    verdict: Verdict,
    recycling: bool,
    *,
    give_up: Callable[[RunningJob, Overtime], None],
    recycle: Callable[[], None],
) -> None:
    """Ask overdue jobs to stop; end the late ones as ``verdict`` says (unless ``recycling``).

    Late jobs are ended by recycling the process when the verdict says so;
    else a worker shutting down leaves them to the end of its shutdown
    timeout, and a worker that cannot recycle gives up on a timed-out thread
    (``give_up``) or, for a cancelled one, can only say so.
    """
    grace = verdict.grace
    for running, over in verdict.asked:
        running.stop()
        logger.warning(
            "job %s: over its timeout of %s s; asked to stop (grace %s s)",
            running.claimed.id,
            over.timeout,
            grace,
            extra=joblog.job_fields(running.claimed),
        )
    if recycling:  # already waiting to recycle: the late ones end with it
        return
    for running, over in verdict.late:
        job_id = running.claimed.id
        if verdict.recycle:
            why = "timed out" if over.reason == "timeout" else "cancelled or lost"
            logger.warning(
                "job %s: still running %s s after it was asked to stop (%s)", job_id, grace, why
            )
        elif verdict.can_recycle:  # shutting down: the shutdown timeout decides
            logger.warning(
                "job %s: still running %s s after it was asked to stop; it ends with this "
                "process at the end of the shutdown",
                job_id,
                grace,
            )
        elif over.reason == "timeout":
            give_up(running, over)
        else:
            logger.warning(
                "job %s: still running %s s after it was cancelled; this process cannot end "
                "it (see %s)",
                job_id,
                grace,
                docs_url("tasks", "timeouts"),
            )
    if verdict.late and verdict.recycle:
        recycle()
