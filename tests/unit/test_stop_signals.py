"""The stop-signal log: a stop signal any thread takes is written down at once.

Real signals, real threads and a real fork: what counts is which thread the
kernel hands a signal to, and what CPython's C-level handler does there.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator

import pytest

from django_dispatch.runtime.stop_signals import StopSignalLog, stop_signal_arrived

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.fixture
def log() -> Iterator[StopSignalLog]:
    """A log as a worker opens it: its handlers installed first, in the main thread."""
    handled: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda signum, frame: handled.append(signum))
        for signum in (signal.SIGTERM, signal.SIGUSR1)
    }
    opened = StopSignalLog.open()
    assert opened is not None
    try:
        yield opened
    finally:
        opened.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def signal_from_a_thread(signum: int) -> None:
    """``signum`` to a thread of its own, with the main thread blocking it (as in a recycle):
    only the C-level handler, in that thread, can have seen it when this returns."""

    def take_it() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})  # inherited from the main thread
        signal.pthread_kill(threading.get_ident(), signum)

    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        thread = threading.Thread(target=take_it)
        thread.start()
        thread.join()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})


def read_copy(log: StopSignalLog) -> bool:
    return stop_signal_arrived(os.dup(log.read))


def test_a_stop_signal_another_thread_took_is_in_the_log(log: StopSignalLog) -> None:
    assert not read_copy(log)
    signal_from_a_thread(signal.SIGTERM)
    assert read_copy(log)


def test_other_signals_are_not_stop_requests(log: StopSignalLog) -> None:
    signal_from_a_thread(signal.SIGUSR1)
    assert not read_copy(log)


def test_no_log_and_a_bad_descriptor_read_as_no_stop(tmp_path) -> None:
    assert not stop_signal_arrived(None)
    with open(tmp_path / "not-a-pipe", "wb") as handle:
        assert not stop_signal_arrived(os.dup(handle.fileno()))


def test_the_log_is_not_left_behind() -> None:
    log = StopSignalLog.open()
    assert log is not None
    log.close()
    log.close()  # twice: nothing (a fork's copy is closed by the fork hook first)
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left pointing at a closed pipe
    with pytest.raises(OSError):
        os.fstat(log.read)


def test_the_successor_reads_a_stop_from_the_inherited_end() -> None:
    """What ``pass_on`` leaves: a pipe whose write end died with ``execve``."""
    read, write = os.pipe()
    os.write(write, bytes([signal.SIGUSR1, signal.SIGTERM]))
    os.close(write)
    assert stop_signal_arrived(read)
    with pytest.raises(OSError):
        os.fstat(read)  # closed: not passed on to task code's subprocesses


def test_a_process_forked_from_task_code_writes_nothing_to_it(log: StopSignalLog) -> None:
    pid = os.fork()
    if pid == 0:  # the child: its wakeup fd and its copies of the pipe's ends must be gone
        gone = 0
        for fd in (log.read, log.write):
            try:
                os.fstat(fd)
            except OSError:
                gone += 1
        os._exit(0 if signal.set_wakeup_fd(-1) == -1 and gone == 2 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert signal.set_wakeup_fd(log.write, warn_on_full_buffer=False) == log.write  # ours still
