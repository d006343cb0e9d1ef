"""Procrastinate: ``defer()``, ``batch_defer()`` and its worker.

Three configurations (``--config``):

- ``matched``: sync tasks, as Django code using the ORM would be (Procrastinate
  runs them in threads), ``concurrency=C``;
- ``async``: the same jobs as ``async def`` tasks, run on the worker's event
  loop, ``concurrency=C``;
- ``defaults``: sync tasks, the worker's default concurrency (1).

The connection pool may grow to ``C + 2`` connections, the same budget as a
django_dispatch worker (``--pool-size`` overrides it: the async check's
concurrency=200 gets what one django_dispatch worker holds); every other
option is the library's default (LISTEN/NOTIFY on, 5 s polling fallback,
jobs kept). The async check's job (``async_sleep``) is an ``async def`` in
every configuration, so it runs on the worker's event loop.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import procrastinate
import psycopg
from harness import ORDER_INSERT_SQL, ORDER_UPDATE_SQL, Driver, main

#: The realistic job's connection, one per worker thread (or one per event
#: loop for async tasks), opened on first use, as Django keeps one per thread.
_local = threading.local()
_async_pool: list = []


def noop() -> None:
    """Does nothing."""


def record_start(seq: int) -> None:
    """Append ``seq`` and the wall-clock start time to ``$BENCH_LATENCY_FILE``."""
    started = time.time()
    with open(os.environ["BENCH_LATENCY_FILE"], "a") as f:
        f.write(f"{seq} {started:.6f}\n")


def realistic(seq: int) -> None:
    """Insert a row, then update it (two statements, autocommit)."""
    db = getattr(_local, "db", None)
    if db is None:
        db = _local.db = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    (order_id,) = db.execute(ORDER_INSERT_SQL, [seq]).fetchone()
    db.execute(ORDER_UPDATE_SQL, [order_id])


async def async_realistic(seq: int) -> None:
    """The same on the event loop, with a connection from a small pool of our own."""
    db = _async_pool.pop() if _async_pool else None
    if db is None:
        db = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
    try:
        cursor = await db.execute(ORDER_INSERT_SQL, [seq])
        (order_id,) = await cursor.fetchone()
        await db.execute(ORDER_UPDATE_SQL, [order_id])
    finally:
        _async_pool.append(db)


async def async_sleep() -> None:
    """An I/O-bound job: awaits ``$BENCH_SLEEP_MS`` ms; on the event loop in every config."""
    await asyncio.sleep(float(os.environ.get("BENCH_SLEEP_MS", "50")) / 1000)


async def async_noop() -> None:
    """Does nothing, on the event loop."""


async def async_record_start(seq: int) -> None:
    record_start(seq)


def make_app(db_url: str, pool_size: int, *, asynchronous: bool = False) -> procrastinate.App:
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=db_url, min_size=1, max_size=pool_size)
    )
    app.task(name="noop")(async_noop if asynchronous else noop)
    app.task(name="record_start")(async_record_start if asynchronous else record_start)
    app.task(name="realistic")(async_realistic if asynchronous else realistic)
    app.task(name="async_sleep")(async_sleep)
    return app


class ProcrastinateDriver(Driver):
    unfinished_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    CONFIGS = {
        "matched": "sync tasks in threads, concurrency=C",
        "async": "async tasks on the event loop, concurrency=C",
        "defaults": "sync tasks, concurrency=1 (library default)",
    }

    @classmethod
    def add_arguments(cls, parser) -> None:
        # The async check (#20): at concurrency=200 a pool of C + 2 would ask
        # for more sessions than the server has; it gets the budget of one
        # django_dispatch worker process instead.
        parser.add_argument("--pool-size", type=int, default=0, help="default: C + 2")

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

    def enqueue_realistic_bulk(self, count: int) -> None:
        for start in range(0, count, 10_000):
            seqs = range(start, min(count, start + 10_000))
            self.app.tasks["realistic"].batch_defer(*[{"seq": seq} for seq in seqs])

    def enqueue_sleep_bulk(self, count: int) -> None:
        for start in range(0, count, 10_000):
            self.app.tasks["async_sleep"].batch_defer(*[{}] * min(10_000, count - start))

    def worker_argv(self, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "drivers.procrastinate", "worker",
                "--concurrency", str(concurrency), "--pool-size", str(self.args.pool_size),
                *self.config_argv()]  # fmt: skip

    def run_worker(self) -> None:
        concurrency = 1 if self.config == "defaults" else self.args.concurrency
        pool_size = self.args.pool_size or concurrency + 2
        app = make_app(self.db, pool_size=pool_size, asynchronous=self.config == "async")
        app.run_worker(concurrency=concurrency, wait=True)

    def close(self) -> None:
        if hasattr(self, "app"):
            self.app.close()


if __name__ == "__main__":
    # Use the module under its importable name, as Procrastinate wants its app to be.
    from drivers import procrastinate as importable

    main(importable.ProcrastinateDriver)
