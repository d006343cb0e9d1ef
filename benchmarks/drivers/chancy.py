"""Chancy: ``sync_push()`` (one job), ``sync_push_many()`` (bulk) and its ``Worker``.

Each worker process runs ``Worker(chancy)`` as Chancy's guide shows, with its
default plugins (leadership, pruner, recovery, metrics, workflows) and its
default connection pool (up to 10); jobs go to the ``default`` queue, whose
settings live in the database (declared by ``setup``). Configurations
(``--config``):

- ``matched``: ``Queue("default", concurrency=C, executor=Threaded,
  eager_polling=True)``: sync jobs in C threads per process, as
  django_dispatch runs them;
- ``async``: the same jobs as ``async def`` on the worker's event loop
  (``executor=Async``), ``concurrency=C``;
- ``defaults``: the queue's defaults (process pool of one process per CPU,
  recycled every 100 jobs, ``polling_interval=5``) except ``eager_polling=True``;
- ``defaults, async``: ``executor=Async`` at its default concurrency (100),
  ``eager_polling=True``: the async check's row at defaults.

All set ``eager_polling``, which Chancy documents for queues where jobs are
continuously available: without it a worker fetches only when a push is
notified or every ``polling_interval`` (5 s), so a backlog queued before the
workers start drains at W x concurrency jobs per 5 s (measured: 0.9 jobs/s
with 2 processes at the default concurrency of 2 CPUs), which no run could
wait for. Chancy writes finished jobs in batches once a second
(``send_outgoing_interval``), so a drain is seen finished up to a second
after its last job ran, and its first finished job only at the first write:
jobs finished before it but written in the same flush count in the steady
part with little time, so ``steady_drain_per_s`` overstates drains of a few
seconds (``drain_per_s`` does not). Chancy's per-job INFO log lines ("Pulled ...") are
off: its logger is at WARNING, as a deployment would set it (the other
systems log nothing per job). The async realistic job takes a connection from
a pool of its own of at most C (``defaults, async``: 10) per process; the
async check's sleep jobs are ``async def`` and run only in the async configs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time

import psycopg
from chancy import Chancy, Job, Queue, Worker
from harness import ORDER_INSERT_SQL, ORDER_UPDATE_SQL, Driver, main

#: The realistic job's connection, one per job thread (or pool process),
#: opened on first use, as Django keeps one per thread.
_local = threading.local()
#: The async realistic job's connections: idle ones, and how many are open.
_async_idle: list[psycopg.AsyncConnection] = []
_async_open = 0
_async_freed: asyncio.Event | None = None


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


async def async_noop() -> None:
    """Does nothing, on the event loop."""


async def async_record_start(seq: int) -> None:
    record_start(seq)


async def async_realistic(seq: int) -> None:
    """The same on the event loop, with a connection from a small pool of our own
    (at most ``$BENCH_CHANCY_POOL`` per process)."""
    global _async_open, _async_freed
    if _async_freed is None:
        _async_freed = asyncio.Event()
    while not _async_idle and _async_open >= int(os.environ["BENCH_CHANCY_POOL"]):
        _async_freed.clear()
        await _async_freed.wait()
    if _async_idle:
        db = _async_idle.pop()
    else:
        _async_open += 1
        db = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
    try:
        cursor = await db.execute(ORDER_INSERT_SQL, [seq])
        (order_id,) = await cursor.fetchone()
        await db.execute(ORDER_UPDATE_SQL, [order_id])
    finally:
        _async_idle.append(db)
        _async_freed.set()


async def async_sleep() -> None:
    """An I/O-bound job: awaits ``$BENCH_SLEEP_MS`` ms."""
    await asyncio.sleep(float(os.environ.get("BENCH_SLEEP_MS", "50")) / 1000)


def quiet_log() -> logging.Logger:
    """Chancy's logger at WARNING: no line per job pulled."""
    log = logging.getLogger("bench.chancy")
    if not log.handlers:
        log.addHandler(logging.StreamHandler())
        log.setLevel(logging.WARNING)
    return log


def queue_for(config: str, concurrency: int) -> Queue:
    """The ``default`` queue as ``config`` declares it."""
    if config == "defaults":
        return Queue(name="default", eager_polling=True)
    if config == "defaults, async":
        return Queue(name="default", executor=Chancy.Executor.Async, eager_polling=True)
    executor = Chancy.Executor.Async if config == "async" else Chancy.Executor.Threaded
    return Queue(name="default", concurrency=concurrency, executor=executor, eager_polling=True)


async def install(db_url: str, queue: Queue) -> None:
    """Chancy's tables (and its default plugins'), then the queue's settings."""
    async with Chancy(db_url, log=quiet_log()) as app:
        await app.migrate()
        await app.declare(queue, upsert=True)


class ChancyDriver(Driver):
    unfinished_sql = (
        "SELECT count(*) FROM chancy_jobs WHERE state IN ('pending', 'retrying', 'running')"
    )
    CONFIGS = {
        "matched": "Queue(concurrency=C, executor=Threaded, eager_polling=True)",
        "async": "async def jobs; Queue(concurrency=C, executor=Async, eager_polling=True)",
        "defaults": "Queue defaults (process pool, one process per CPU, recycled every 100 "
        "jobs) with eager_polling=True",
        "defaults, async": "async def jobs; Queue(executor=Async, eager_polling=True): "
        "concurrency 100 (its default)",
    }

    def __init__(self, args) -> None:
        super().__init__(args)
        #: Jobs are ``async def`` (on the worker's event loop), or sync.
        self.asynchronous = "async" in self.config

    def job(self, func, **kwargs) -> Job:
        """A job of ``func``, or of its ``async def`` twin in the async configs."""
        if self.asynchronous and func is not async_sleep:
            func = globals()[f"async_{func.__name__}"]
        return Job.from_func(func, kwargs=kwargs)

    def setup(self) -> None:
        asyncio.run(install(self.db, queue_for(self.config, self.args.concurrency)))
        self.app = Chancy(self.db, log=quiet_log(), max_connection_pool_size=2)
        self.app.__enter__()

    def enqueue_noop(self) -> None:
        self.app.sync_push(self.job(noop))

    def enqueue_record(self, seq: int) -> None:
        self.app.sync_push(self.job(record_start, seq=seq))

    def push_all(self, jobs: list[Job]) -> None:
        """``sync_push_many`` in one transaction, as the other systems' bulk calls
        (Chancy's default batch is 1,000 per transaction; it inserts row by row)."""
        for _ in self.app.sync_push_many(jobs, batch_size=len(jobs)):
            pass

    def enqueue_bulk(self, count: int) -> bool:
        self.push_all([self.job(noop)] * count)
        return True

    def enqueue_realistic_bulk(self, count: int) -> None:
        self.push_all([self.job(realistic, seq=seq) for seq in range(count)])

    def enqueue_sleep_bulk(self, count: int) -> None:
        if not self.asynchronous:
            raise SystemExit("sleep jobs are async def: run them with --config async")
        self.push_all([self.job(async_sleep)] * count)

    def worker_argv(self, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "drivers.chancy", "worker",
                "--concurrency", str(concurrency), *self.config_argv()]  # fmt: skip

    def run_worker(self) -> None:
        pool = 10 if self.config == "defaults, async" else max(1, self.args.concurrency)
        os.environ["BENCH_CHANCY_POOL"] = str(pool)
        asyncio.run(self._worker())

    async def _worker(self) -> None:
        # SIGTERM (the harness's stop) makes the worker stop: its own handler.
        async with (
            Chancy(self.db, log=quiet_log()) as app,
            Worker(app) as worker,
        ):
            await worker.wait_for_shutdown()

    def close(self) -> None:
        if hasattr(self, "app"):
            self.app.__exit__(None, None, None)


if __name__ == "__main__":
    # Jobs are imported by name in the workers: use the module's importable name.
    from drivers import chancy as importable

    main(importable.ChancyDriver)
