"""What one attempt cost, measured on the worker; written by the completer.

A ``Meter`` starts on the job thread just before task code and stops just
after it: wall time on the monotonic clock, CPU time of that thread
(``time.thread_time``), and the process's peak RSS. Meters are kept by job
id (``METERS``) rather than on the job's objects, so whoever writes the
outcome (the job thread, the control loop after a timeout, the completion
wave) finds it without being handed it.

What the numbers mean:

* ``cpu_seconds`` is the job thread's own CPU. An async task's coroutine runs
  on an event loop that ``async_to_sync`` keeps on a helper thread, so its
  CPU is not this thread's: None for async tasks, rather than a wrong zero.
* ``peak_rss_mb`` is ``getrusage(RUSAGE_SELF).ru_maxrss`` read when the
  attempt ends (a reading at most ``RSS_READ_SECONDS`` old): the process's
  high-water mark since it started, shared with the jobs beside it. It
  never goes down, so it is an upper bound of what this attempt needed,
  exact for a process running one job at a time (``--concurrency 1``),
  which is how to size memory-hungry tasks.
"""

from __future__ import annotations

import resource
import socket
import sys
import threading
import time

from ..conf import usage_mode
from ..store.types import ClaimedJob
from ..store.usage import UsageEntry

#: Meters of the attempts running in this process, by job id.
METERS: dict[int, Meter] = {}
_LOCK = threading.Lock()
HOST = socket.gethostname()
#: ru_maxrss is in KiB on Linux, in bytes on macOS.
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024


#: How long one reading of the process's peak RSS serves: ``getrusage`` costs
#: tens of microseconds here, per job, which a drain of short jobs notices.
RSS_READ_SECONDS = 0.005
_rss_read: tuple[float, float] = (-1.0, 0.0)  # (monotonic time, MB)


def peak_rss_mb() -> float:
    """The process's peak RSS, read at most every ``RSS_READ_SECONDS``.

    A high-water mark only grows, so a reading up to 5 ms old can miss only a
    peak reached within those 5 ms: by a job shorter than that.
    """
    global _rss_read
    now = time.monotonic()
    read_at, value = _rss_read
    if now - read_at >= RSS_READ_SECONDS:
        value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _RSS_UNIT / (1024 * 1024)
        _rss_read = (now, value)
    return value


class Meter:
    """One attempt's clocks; ``stop`` on the job thread, ``reading`` from anywhere.

    A plain class with slots rather than a dataclass: one is made per job,
    and a dataclass's generated ``__init__`` with a default factory costs a
    short job measurable CPU.
    """

    __slots__ = ("began", "cpu", "cpu_began", "rss", "thread_cpu", "wall")

    def __init__(self, thread_cpu: bool = True) -> None:
        self.thread_cpu = thread_cpu  # False: async task, or no usage recorded
        self.began = time.monotonic()
        # A syscall per read: only when the CPU is measured.
        self.cpu_began = time.thread_time() if thread_cpu else 0.0
        self.wall: float | None = None
        self.cpu: float | None = None
        self.rss: float | None = None

    def stop(self) -> None:
        self.wall = time.monotonic() - self.began
        self.cpu = time.thread_time() - self.cpu_began if self.thread_cpu else None
        self.rss = peak_rss_mb()

    def reading(self) -> tuple[float, float | None, float]:
        """(wall, cpu, rss): as stopped, or so far for an attempt still running
        (a timeout recorded by the control loop: its thread's CPU is not ours)."""
        if self.wall is not None:
            return self.wall, self.cpu, self.rss if self.rss is not None else peak_rss_mb()
        return time.monotonic() - self.began, None, peak_rss_mb()


def start(job_id: int, *, thread_cpu: bool) -> Meter:
    """Start the attempt's clocks. The thread's CPU clock (``thread_cpu``) only
    when some usage record may read it: with ``DISPATCH["USAGE"] = "off"``
    nobody does, and the wall clock alone serves the log and the claims ahead."""
    meter = Meter(thread_cpu=thread_cpu and usage_mode() != "off")
    with _LOCK:
        METERS[job_id] = meter
    return meter


def forget(job_id: int, meter: Meter | None) -> None:
    """Drop the job's meter (only that one: a later claim of the job may have its own)."""
    with _LOCK:
        if meter is not None and METERS.get(job_id) is meter:
            del METERS[job_id]


def forget_many(meters: list[tuple[int, Meter | None]]) -> None:
    """``forget`` of many jobs' meters (a wave's) under one hold of the lock."""
    with _LOCK:
        for job_id, meter in meters:
            if meter is not None and METERS.get(job_id) is meter:
                del METERS[job_id]


def entry(claimed: ClaimedJob, outcome: str) -> UsageEntry:
    """The record of ``claimed``'s attempt ending as ``outcome``.

    Without a meter in this process (the attempt ran in the process this one
    replaced by recycling, which settles its timeouts), what was measured is
    lost: the record says so with None.
    """
    with _LOCK:
        meter = METERS.get(claimed.id)
    wall, cpu, rss = meter.reading() if meter is not None else (None, None, None)
    row, lease = claimed.row, claimed.lease
    return UsageEntry(
        job_id=claimed.id,
        namespace=lease.namespace,
        task_path=row["task_path"],
        queue_name=row["queue_name"],
        attempt=row["attempts"],
        worker_id=lease.worker_id,
        host=HOST,
        outcome=outcome,
        started_at=claimed.claimed_at,
        wall_seconds=wall,
        cpu_seconds=cpu,
        peak_rss_mb=rss,
        resources=row.get("resources"),
    )
