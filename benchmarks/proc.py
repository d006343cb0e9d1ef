"""Memory and CPU of worker processes, read from /proc (Linux only)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """``pid`` and all its live descendants."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def status_kb(pid: int, field: str) -> int:
    """A ``VmXXX:`` line of /proc/<pid>/status in kB (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mb(pid: int) -> float:
    """The largest peak resident set (VmHWM) of any process in ``pid``'s tree."""
    return max(status_kb(p, "VmHWM") for p in tree(pid)) / 1024


def rss_mb(pid: int) -> float:
    """Current resident set (VmRSS) of ``pid``'s whole tree."""
    return sum(status_kb(p, "VmRSS") for p in tree(pid)) / 1024


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (field 3 onwards)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """User + system CPU time used so far by ``pid``'s tree (all threads).

    With ``reaped``, also the CPU of children that already exited (PostgreSQL
    backends of closed connections), which the kernel adds to the parent.
    """
    total = 0
    for p in tree(pid):
        fields = _stat(p)
        if fields:  # utime, stime, cutime, cstime are fields 14 to 17
            total += int(fields[11]) + int(fields[12])
            if reaped and p == pid:
                total += int(fields[13]) + int(fields[14])
    return total / CLOCK_TICKS


def parent(pid: int) -> int:
    return int(_stat(pid)[1])


def machine_cpu_seconds() -> float:
    """CPU time used so far by everything on the machine (all CPUs, idle excluded)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLOCK_TICKS


def machine_busy(seconds: float = 2.0) -> float:
    """Share of all CPUs busy over ``seconds`` (other work on the machine skews results)."""

    def sample() -> tuple[int, int]:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(ticks), ticks[3] + ticks[4]  # total, idle + iowait

    (total0, idle0), _, (total1, idle1) = sample(), time.sleep(seconds), sample()
    return 1 - (idle1 - idle0) / max(1, total1 - total0)
