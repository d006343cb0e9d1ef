"""Real processes for tests/acceptance/test_timeouts.py
(``python -m tests.recycle_probe MODE ...``).

``handover OUT ENTRIES``: pass a large ``Handover`` through a real
``execve``. The first program builds one of ``ENTRIES`` entries with
255-character partition keys, notes whether that text could travel in one
environment variable (it cannot past 128 KiB: E2BIG), writes what it sends to
``OUT/sent.json`` and re-executes itself with ``recycling.exec_successor``.
The successor (same PID) reads the handover back and writes what it got to
``OUT/received.json``.

``call-command -k rundispatch``, ``management-utility -k rundispatch``: a
script whose command line mentions ``rundispatch`` (as ``pytest -k
rundispatch`` does) runs the worker in burst mode until the queue is empty,
with ``call_command``, or through Django's command-line entry point given a
command line of its own. It must not recycle: re-executing this script's
command line would not bring a worker back.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from django.core.management import ManagementUtility, call_command  # noqa: E402

from django_dispatch.runtime import recycling  # noqa: E402


def handover(out: Path, entries: int) -> None:
    sent = out / "sent.json"
    if sent.exists():  # the successor
        where = os.environ.get(recycling.HANDOVER_ENV)
        received = recycling.Handover.from_environ()
        fd = int(where.split(":")[0]) if where else None
        (out / "received.json").write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "where": where,
                    "handover": received.dumps() if received else None,
                    "env_left": recycling.HANDOVER_ENV in os.environ,
                    "fd_still_open": fd is not None and _is_open(fd),
                }
            )
        )
        return
    key = "k" * 255
    data = recycling.Handover(
        worker_id="w" * 100,
        child=3,
        claimed=entries,
        timed_out=[(i, i + 1, f"{i}:{key}"[:255]) for i in range(entries)],
        stopped=[(10**9, 7, None)],
        released=[(10**9 + 1, 8, key)],
    )
    text = data.dumps()
    sent.write_text(
        json.dumps({"pid": os.getpid(), "handover": text, "fits_in_env": _fits_in_env(text)})
    )
    recycling.exec_successor(data)  # does not return


def _fits_in_env(text: str) -> bool:
    """Whether ``execve`` accepts this text as one environment variable."""
    try:
        subprocess.run(["true"], env={recycling.HANDOVER_ENV: text}, check=True)
    except OSError as e:
        if e.errno == errno.E2BIG:
            return False
        raise
    return True


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def main(argv: list[str]) -> None:
    if argv[0] == "handover":
        handover(Path(argv[1]), int(argv[2]))
    elif argv[0] == "call-command":
        call_command("rundispatch", "--burst", "--concurrency", "2")
    elif argv[0] == "management-utility":
        ManagementUtility(["manage.py", "rundispatch", "--burst", "--concurrency", "2"]).execute()
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
