"""After an outcome is written: its log line and metric, and ``task_finished``.

The completer's announcing half. ``task_finished`` receivers are user code,
so they never run on the control loop: a success written in a wave is
reported on the ``Reporter``'s own thread, anything else by the thread that
wrote it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from django.db import connections

from .. import store
from ..compat import task_finished
from ..conf.redaction import error_redactor
from ..observability import joblog
from ..store import ClaimedJob
from ..tasks.results import send_robust, signal_sender
from . import metering
from .executor import Outcome
from .running import RunningJob

logger = logging.getLogger("django_dispatch.worker")

#: Most successes waiting for the reporter (``Reporter.behind``); beyond it a
#: job thread writes and reports its own: slow ``task_finished`` receivers
#: then slow the jobs down instead of growing this backlog.
REPORT_BACKLOG = 256


class Reporter:
    """After a wave: report the successes whose job threads went on to other jobs.

    A job thread hands its success to the wave (``BatchCompleter.hand_over``)
    and takes its next job at once instead of waiting for the wave's commit:
    the wave then carries every success that finished while the last one was
    written, and threads do not idle for a round trip per job. What the
    thread would have done after the commit is done here (``report``, given
    by the completer), on a thread of its own, never on the control loop:
    ``task_finished`` (its receivers are user code), the log line, letting
    go of a job found cancelled, and, when the wave failed, writing the
    outcome one by one.
    """

    def __init__(self, report: Callable[[RunningJob], None]) -> None:
        self.report = report
        self.inbox: queue.SimpleQueue[RunningJob | None] = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=store.carrying_database(self._loop), name="dispatch-finished", daemon=True
        )
        self.thread.start()

    def put(self, running: RunningJob) -> None:
        """From the control loop (``settle``, ``abort``): the wave is written or failed."""
        self.inbox.put(running)

    def behind(self) -> bool:
        """Whether ``REPORT_BACKLOG`` successes already wait to be reported.

        One thread runs every handed-over success's ``task_finished``
        receivers (user code): were they slower than the jobs, its queue
        would grow without bound, and the reports lag ever further. A job
        thread asks before handing a success over and, if the reporter is
        behind, writes and reports it itself: the receivers then run on as
        many threads as jobs, at the jobs' pace.
        """
        return self.inbox.qsize() >= REPORT_BACKLOG

    def stop(self, timeout: float = 5.0) -> None:
        """Report what is queued, then end (after the worker's last wave)."""
        self.inbox.put(None)
        self.thread.join(timeout)

    def _loop(self) -> None:
        try:
            while (running := self.inbox.get()) is not None:
                try:
                    self.report(running)
                except Exception:
                    logger.exception("job %s: could not report its outcome", running.claimed.id)
        finally:
            connections.close_all()


def settle_quietly(running: RunningJob, reporter: Reporter) -> None:
    """On the control loop, once the wave is written: a success nobody observes.

    A won success with no ``task_finished`` to send has nothing left but
    its count and its meter: done here rather than after a hop to the
    reporter's thread (a queue and a thread switch per job, about 5% of a
    worker's CPU in a drain of short jobs). A lost one, or a failed wave,
    still has writes to make: those go to the reporter as always.
    """
    if running.won:
        joblog.finished(running.claimed, "succeeded")
        metering.forget(running.claimed.id, running.meter)
    else:
        reporter.put(running)


#: The metric state and log outcome of each kind of write (see ``observability.joblog``).
_REPORTED = {
    "succeeded": "succeeded",
    "retry": "retried",
    "failed": "failed",
    "interrupted": "interrupted",
    "released": "released",
}


def report_written(claimed: ClaimedJob, outcome: Outcome, won: bool) -> None:
    """Log and count an outcome written one by one: as written, or found lost."""
    if outcome.kind == "discarded":  # won: the ack found it cancelled
        joblog.finished(claimed, "cancelled" if won else "lost", detail="its")
    elif not won:
        joblog.finished(claimed, "lost", detail=f"its {outcome.kind}")
    else:
        joblog.finished(
            claimed,
            _REPORTED[outcome.kind],
            exception=outcome.exception,
            retry_in=outcome.retry_in,
            detail=outcome.why if outcome.kind == "released" else "",
        )


def report_released(claimed: ClaimedJob, released: bool, cancelled: bool, *, why: str) -> None:
    """Log and count a hand-back: released, or found cancelled or lost meanwhile."""
    if released:
        joblog.finished(claimed, "released", detail=why)
    else:
        joblog.finished(claimed, "cancelled" if cancelled else "lost", detail="its unfinished")


def signal_finished_and_close(outcome: Outcome) -> None:
    """``signal_finished`` on a thread of its own, closing its connections after."""
    try:
        signal_finished(outcome)
    finally:
        connections.close_all()


def signal_finished(outcome: Outcome) -> None:
    """Send ``task_finished`` for a written outcome (robustly: receivers are user code)."""
    result = outcome.task_result
    if result is None:
        return
    try:
        sender = signal_sender(result.task)
    except Exception:  # its backend alias is gone from TASKS: the outcome is written anyway
        logger.exception("job %s: task_finished not sent (no backend to send it)", result.id)
        return
    if outcome.exception is None or error_redactor() is not None:
        # With a redactor, no raw traceback for receivers (Django's own logs it).
        send_robust(task_finished, sender, result)
        return
    # Sent from inside an except block, so that Django's own log receiver
    # (which reads sys.exc_info()) logs the task's traceback.
    try:
        raise outcome.exception
    except BaseException:
        send_robust(task_finished, sender, result)
