"""Procrastinate: ``defer()``, ``batch_defer()`` and its worker with ``concurrency=C``.

Tasks are sync functions, as Django code using the ORM would be; Procrastinate
runs them in threads. The connection pool may grow to ``C + 2`` connections,
the same budget as a django_dispatch worker; every other option is the
library's default (LISTEN/NOTIFY on, 5 s polling fallback, jobs kept).
"""

from __future__ import annotations

import os
import sys
import time

import procrastinate
from harness import Driver, main


def noop() -> None:
    """Does nothing."""


def record_start(seq: int) -> None:
    """Append ``seq`` and the wall-clock start time to ``$BENCH_LATENCY_FILE``."""
    started = time.time()
    with open(os.environ["BENCH_LATENCY_FILE"], "a") as f:
        f.write(f"{seq} {started:.6f}\n")


def make_app(db_url: str, pool_size: int) -> procrastinate.App:
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=db_url, min_size=1, max_size=pool_size)
    )
    app.task(name="noop")(noop)
    app.task(name="record_start")(record_start)
    return app


class ProcrastinateDriver(Driver):
    unfinished_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"

    def setup(self) -> None:
        self.app = make_app(self.db, pool_size=2).open()
        self.app.schema_manager.apply_schema()

    def enqueue_noop(self) -> None:
        self.app.tasks["noop"].defer()

    def enqueue_record(self, seq: int) -> None:
        self.app.tasks["record_start"].defer(seq=seq)

    def enqueue_bulk(self, count: int) -> bool:
        self.app.tasks["noop"].batch_defer(*[{}] * count)
        return True

    def worker_argv(self, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "drivers.procrastinate", "worker",
                "--concurrency", str(concurrency)]  # fmt: skip

    def run_worker(self) -> None:
        concurrency = self.args.concurrency
        app = make_app(self.db, pool_size=concurrency + 2)
        app.run_worker(concurrency=concurrency, wait=True)

    def close(self) -> None:
        if hasattr(self, "app"):
            self.app.close()


if __name__ == "__main__":
    # Use the module under its importable name, as Procrastinate wants its app to be.
    from drivers import procrastinate as importable

    main(importable.ProcrastinateDriver)
