"""``--processes P``: fork P worker processes and look after them.

The supervisor itself touches no job. It forwards SIGTERM/SIGINT to its
children, restarts a child that died abnormally (killed by the OOM killer,
segfault) so that siblings never go down with it, and exits non-zero if any
child ever did, so the abnormal exit is not silent.

A child that recycles itself to end task code that ignored its timeout or
its cancel (see ``timeouts``) re-executes in place: same PID, same index and
worker id. The supervisor sees no exit, so a recycle is neither a restart
nor an abnormal exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from types import FrameType

from django.db import connections

logger = logging.getLogger("django_dispatch.worker")

RESTART_PAUSE = 1.0


def _fork(run_child: Callable[[int], int], index: int, in_child: Callable[[], None] | None) -> int:
    connections.close_all()  # a child must never share the parent's sockets
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if in_child is not None:
                in_child()
            code = run_child(index)
        except BaseException:
            logger.exception("worker process %s crashed", index)
        finally:
            os._exit(code)
    return pid


def supervise(
    processes: int,
    run_child: Callable[[int], int],
    *,
    restart: bool,
    in_child: Callable[[], None] | None = None,
    child_exited: Callable[[int], None] | None = None,
) -> int:
    """Run ``processes`` children until they all exit; 1 if any exited abnormally.

    ``in_child`` runs first thing in each forked child, ``child_exited(pid)``
    in the supervisor once a child is gone (``--metrics-port``: drop the
    inherited listening socket; mark the child's live gauges dead).
    """
    children: dict[int, int] = {}  # pid -> index
    stopping = False
    abnormal = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for index in range(processes):
        children[_fork(run_child, index, in_child)] = index
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
        if pid not in children:
            continue
        index = children.pop(pid)
        if child_exited is not None:
            child_exited(pid)
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            continue
        abnormal = True
        logger.error("worker process %s (pid %s) exited abnormally with %s", index, pid, code)
        if restart and not stopping:
            time.sleep(RESTART_PAUSE)
            children[_fork(run_child, index, in_child)] = index
    return 1 if abnormal else 0
