"""The fleet check's claim latency, as each worker process sees it.

With ``$BENCH_WAVE_TIMES`` set to a directory, every call of the worker's
``BatchCompleter.write_wave`` (one transaction, or one statement where
``store.wave`` applies: the successes finished since the last wave, the
claim that refills their slots, the commit) is
timed, and at exit the process writes one line per wave to
``<directory>/<pid>.txt``: wall-clock start, seconds it took, jobs written,
jobs claimed. Through PgBouncer this includes the wait for a server
connection, which is what a fleet larger than the pool queues on; the
server-side time of the claim statement alone comes from
pg_stat_statements. Costs a clock read and a tuple per wave.
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path


def install(directory: str) -> None:
    from django_dispatch.runtime import completer

    original = completer.BatchCompleter.write_wave
    waves: list[tuple[float, float, int, int]] = []

    def write_wave(self, batch, claim, limit, *more):  # more: the one-statement path's
        wall, started = time.time(), time.perf_counter()
        claimed = original(self, batch, claim, limit, *more)
        waves.append((wall, time.perf_counter() - started, len(batch), len(claimed)))
        return claimed

    def dump() -> None:
        lines = "".join(f"{w:.6f} {d:.6f} {b} {c}\n" for w, d, b, c in waves)
        Path(directory, f"{os.getpid()}.txt").write_text(lines)

    completer.BatchCompleter.write_wave = write_wave
    atexit.register(dump)
