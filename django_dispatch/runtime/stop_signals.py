"""Stop requests survive a worker's recycle, whichever thread the kernel hands them to.

A recycle replaces the program with ``execve``; a SIGTERM or SIGINT sent
meanwhile must reach the successor, which settles the handover and stops.
Two ways it could be lost, each closed here:

- to the main thread, between the decision to recycle and ``execve``:
  ``hold_stop_signals`` blocks them there, and a pending signal survives
  ``execve``; the successor's ``release_stop_signals`` delivers it;
- to any other thread, which the main thread's mask does not cover:
  ``StopSignalLog`` writes it down at once, and the successor reads it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("django_dispatch.worker")

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def hold_stop_signals() -> None:
    """Keep SIGTERM/SIGINT pending (not lost, not fatal) across ``execve``.

    The signal mask and pending signals survive ``execve``; the successor
    releases them with ``release_stop_signals`` once its handlers are in
    place, so a stop request made during the recycle reaches it.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def stop_requested(worker: Any) -> bool:
    """Whether ``worker`` was asked to stop; call it after ``hold_stop_signals``.

    A Python function on purpose: CPython runs the handler of a signal that
    arrived (its C-level part tripped) only where the interpreter checks,
    such as a function's start. Read inline, ``signalled_at`` could miss a
    SIGTERM that landed as the signals were being held, whose handler would
    then run only inside ``exec_successor``, too late to be passed on.
    Entering this function runs any such handler first.
    """
    return worker.signalled_at is not None


def release_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@dataclass
class StopSignalLog:
    """Every signal this process takes, written down by whichever thread the kernel gave it to.

    ``hold_stop_signals`` blocks them in the main thread only: the kernel
    may still hand a SIGTERM to any other thread (a job thread, the very
    zombie the recycle is for). CPython's C-level handler runs in that
    thread at once, but the Python handler runs in the main thread only at
    its next check, which can come after ``stop_requested`` read nothing
    and before ``execve``: the request would end with the old program.
    Blocking the signals in every thread instead would close that window
    but leave them blocked in every subprocess task code starts (a
    ``terminate()`` that never lands). So the log is a pipe made the wakeup
    fd, which the C handler writes each signal's number to, in the thread
    that took it, before anything else can run. Its read end passes to the
    successor (``pass_on``), which reads what arrived up to ``execve``
    (``stop_signal_arrived``).
    """

    read: int
    write: int
    closed: bool = False

    @classmethod
    def open(cls) -> StopSignalLog | None:
        """From the main thread, once the handlers are installed; None if the wakeup fd is
        someone else's (left alone) or cannot be set here (not the main thread)."""
        read, write = os.pipe()  # neither end outlives execve unless passed on
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        try:
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:
            previous = None
        if previous == -1:
            global _open  # the one log of this process, closed in its forks
            _open = cls(read, write)
            return _open
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return None

    def pass_on(self) -> int:
        """Keep the read end open across ``execve``: its number, for the handover."""
        os.set_inheritable(self.read, True)
        return self.read

    def close(self) -> None:
        """Once the worker ran to its end in this program (no recycle), and in a process
        forked from task code: its signals are not this worker's, and its copies of the
        pipe's ends would keep the successor from reading the end of the pipe."""
        global _open
        if self.closed:
            return
        self.closed = True
        if _open is self:
            _open = None
        with contextlib.suppress(ValueError):  # a fork from a thread Python does not know
            signal.set_wakeup_fd(-1)
        for fd in (self.read, self.write):
            with contextlib.suppress(OSError):
                os.close(fd)


_open: StopSignalLog | None = None


def _close_in_child() -> None:
    if _open is not None:
        _open.close()


os.register_at_fork(after_in_child=_close_in_child)


def stop_signal_arrived(fd: int | None) -> bool:
    """In the successor, ``fd`` the handover's ``stop_log``: whether the predecessor took a
    stop signal its handler may never have seen."""
    if fd is None:
        return False
    received = b""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise OSError(f"descriptor {fd} is not a pipe")
        while chunk := os.read(fd, 4096):  # ends at EOF: the write end died with execve
            received += chunk
    except BlockingIOError:
        pass
    except OSError:
        logger.exception(
            "could not read the predecessor's stop-signal log (descriptor %s): a stop sent "
            "during the recycle may not have reached this process; send SIGTERM again",
            fd,
        )
        return False
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return any(number in received for number in STOP_SIGNALS)
