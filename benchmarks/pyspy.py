"""py-spy attached to a drain's worker processes over its steady part.

``profile_worker.py`` asks for it through the environment of the driver it
runs (``BENCH_PYSPY``: the py-spy binary; ``BENCH_PYSPY_DIR``: where the raw
collapsed stacks go; ``BENCH_PYSPY_ARGS``: extra ``py-spy record`` options).
The harness then attaches one ``py-spy record --pid`` per worker when the
first job finishes, the same moment its steady CPU counters start, and stops
them with SIGINT (py-spy's Ctrl-C: it writes its file) once the drain is
over and before the workers are stopped: start-up and shutdown stay out of
the profile, as they stay out of the CPU per job. Standard library only: it
runs in every driver's virtualenv.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path

#: How long py-spy may take to write its file after SIGINT.
STOP_TIMEOUT = 60.0


class Recorder:
    """``py-spy record --format raw`` on each of a drain's worker processes."""

    def __init__(self, binary: str, outdir: Path, extra: list[str]) -> None:
        self.binary, self.outdir, self.extra = binary, outdir, extra
        self.procs: list[subprocess.Popen] = []

    def attach(self, pids: list[int]) -> None:
        self.outdir.mkdir(parents=True, exist_ok=True)
        for pid in pids:
            log = open(self.outdir / f"pyspy-{pid}.log", "w")  # noqa: SIM115
            argv = [self.binary, "record", "--pid", str(pid), "--format", "raw",
                    "--output", str(self.outdir / f"pyspy-{pid}.raw"), *self.extra]  # fmt: skip
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
            log.close()

    def stop(self) -> None:
        """Stop sampling and wait until every recorder has written its file."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def from_env() -> Recorder | None:
    """The recorder ``profile_worker.py`` asked for, or None (an ordinary measurement)."""
    binary = os.environ.get("BENCH_PYSPY")
    if not binary:
        return None
    extra = shlex.split(os.environ.get("BENCH_PYSPY_ARGS", ""))
    return Recorder(binary, Path(os.environ["BENCH_PYSPY_DIR"]), extra)
