"""PgQueuer: ``SyncQueries.enqueue()`` (one job), ``Queries.enqueue()`` with lists
(bulk) and a ``QueueManager``.

PgQueuer runs only async entrypoints, so its tasks are async no-ops. Four
configurations (``--config``), each a slot setting on one database driver:

- slot-matched (``asyncpg+uvloop``, ``psycopg``): in-flight jobs capped at C
  (``max_concurrent_tasks``), which PgQueuer requires to be at least twice its
  ``batch_size``, hence a batch of C / 2;
- ``defaults, ...``: ``QueueManager.run()`` as documented (``batch_size=10``,
  no cap on concurrent tasks): more completions per commit and more jobs in
  flight, which makes it faster on no-op jobs;
- ``asyncpg+uvloop``: the worker as PgQueuer's README and ``pgq run`` run it,
  on an asyncpg connection and uvloop; the bulk enqueues and the realistic
  job's own connections use asyncpg too;
- ``psycopg``: the worker on a psycopg ``AsyncConnection`` and plain asyncio
  (the harness's earlier rows). Its NOTIFY watcher holds the connection inside
  ``notifies(timeout=1.0)`` until a notification arrives, so while jobs run
  and none arrive, each dequeue and completion flush can wait up to a second
  (the async check's sleep jobs drain at about 50/s so, whatever the slots).

Single enqueues go through PgQueuer's synchronous API on a plain psycopg
connection in every configuration (its only sync driver), as a Django view
would call it (driving the async API through an event loop per call inflated
its cost). Finished jobs leave the ``pgqueuer`` table, so "unfinished" is
simply its row count.

The async check (``--sleep-ms``) runs ``defaults, asyncpg+uvloop`` and
``asyncpg+uvloop`` with C = the async slots per process (200:
``batch_size=100, max_concurrent_tasks=200``).

The realistic job runs twice in the asyncpg + uvloop configurations
(``ORM_JOB``). First with its own body, two statements on the worker's asyncpg
connections: PgQueuer at its fastest. Then as a Django site on PgQueuer
writes it, giving the ``ORM job`` rows of the report: the same body as
django_dispatch's and django-tasks-db's task (``bench.orders.place_order``,
two ORM statements), called through ``asgiref.sync.sync_to_async`` in worker
processes that set Django up on the benchmark's database
(``benchproject.settings_pgqueuer``: the same ``DATABASES`` and
``CONN_MAX_AGE``):

- ``defaults, asyncpg+uvloop``: ``sync_to_async(place_order)`` as Django's
  documentation shows it (``thread_sensitive=True``): every ORM call of a
  process on one thread and one connection;
- ``asyncpg+uvloop`` (C slots): ``thread_sensitive=False`` on a pool of C
  threads, each with its own connection, as django_dispatch's C job threads
  have.

The psycopg configurations do not run it: their queue loop waits up to a
second inside ``notifies()``, which already holds their own realistic rows
far below the asyncpg ones, whatever the job body.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import psycopg
import uvloop
from harness import ORDER_INSERT_SQL, ORDER_UPDATE_SQL, Driver, main
from pgqueuer import PsycopgDriver, Queries, QueueManager
from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
from pgqueuer.adapters.persistence.queries import SyncQueries


async def connect(db_url: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(db_url, autocommit=True)


async def connect_queries(db_url: str, pgq_run: bool) -> tuple[Queries, Callable[[], Awaitable]]:
    """``Queries`` on a connection of its own and how to close it: psycopg, or asyncpg."""
    if pgq_run:
        conn = await asyncpg.connect(db_url)
        return Queries(AsyncpgDriver(conn)), conn.close
    pconn = await connect(db_url)
    return Queries(PsycopgDriver(pconn)), pconn.close


#: The configurations that also drain the realistic job written with Django's ORM,
#: and whether their ``sync_to_async`` is thread-sensitive (see the docstring).
ORM_JOB = {"defaults, asyncpg+uvloop": True, "asyncpg+uvloop": False}

#: The realistic job's statements in asyncpg's placeholder style.
ASYNCPG_INSERT_SQL = ORDER_INSERT_SQL.replace("%s", "$1")
ASYNCPG_UPDATE_SQL = ORDER_UPDATE_SQL.replace("%s", "$1")


class PgQueuerDriver(Driver):
    unfinished_sql = "SELECT count(*) FROM pgqueuer"
    CONFIGS = {
        "asyncpg+uvloop": "batch_size=C/2, max_concurrent_tasks=C; asyncpg, uvloop (`pgq run`)",
        "defaults, asyncpg+uvloop": "batch_size=10, no cap on concurrent tasks (library "
        "defaults); asyncpg, uvloop (`pgq run`)",
        "psycopg": "batch_size=C/2, max_concurrent_tasks=C; psycopg, asyncio",
        "defaults, psycopg": "batch_size=10, no cap on concurrent tasks (library defaults); "
        "psycopg, asyncio",
    }

    def __init__(self, args) -> None:
        super().__init__(args)
        #: QueueManager.run()'s own defaults, rather than C slots.
        self.defaults = self.config.startswith("defaults")
        #: The worker as `pgq run` runs it: asyncpg and uvloop.
        self.pgq_run = "asyncpg" in self.config
        #: A worker process of the ORM job (``realistic_variants``).
        self.orm = getattr(args, "realistic_body", "") == "orm"

    def setup(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.queries, self.close_queries = self.loop.run_until_complete(
            connect_queries(self.db, self.pgq_run)
        )
        self.loop.run_until_complete(self.queries.install())
        self.sync_conn = psycopg.connect(self.db, autocommit=True)
        self.sync = SyncQueries(SyncPsycopgDriver(self.sync_conn))

    def enqueue_noop(self) -> None:
        self.sync.enqueue("noop", None)

    def enqueue_record(self, seq: int) -> None:
        self.sync.enqueue("record_start", str(seq).encode())

    def enqueue_bulk(self, count: int) -> bool:
        self.loop.run_until_complete(
            self.queries.enqueue(["noop"] * count, [None] * count, [0] * count)
        )
        return True

    @classmethod
    def add_arguments(cls, parser) -> None:
        # The worker's realistic job: its own asyncpg/psycopg body, or "orm".
        parser.add_argument("--realistic-body", choices=["", "orm"], default="")

    def realistic_variants(self) -> list[str]:
        return ["orm"] if self.config in ORM_JOB else []

    def enqueue_realistic_bulk(self, count: int) -> None:
        entrypoint = "realistic_orm" if self.realistic_body == "orm" else "realistic"
        for start in range(0, count, 10_000):
            seqs = range(start, min(count, start + 10_000))
            self.loop.run_until_complete(
                self.queries.enqueue(
                    [entrypoint] * len(seqs), [str(s).encode() for s in seqs], [0] * len(seqs)
                )
            )

    def enqueue_sleep_bulk(self, count: int) -> None:
        for start in range(0, count, 10_000):
            size = min(10_000, count - start)
            self.loop.run_until_complete(
                self.queries.enqueue(["async_sleep"] * size, [None] * size, [0] * size)
            )

    def worker_argv(self, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "drivers.pgqueuer", "worker", "--concurrency",
                str(concurrency), "--sleep-ms", repr(self.args.sleep_ms),
                "--realistic-body", self.realistic_body, *self.config_argv()]  # fmt: skip

    def run_worker(self) -> None:
        # Only the workers of the ORM job set Django up: the others stay as
        # light as PgQueuer without Django (start-up, RSS).
        if self.orm:
            from drivers import django_setup

            django_setup.configure(self.db, "benchproject.settings_pgqueuer")
        if self.pgq_run:
            uvloop.run(self._worker())
        else:
            asyncio.run(self._worker())

    async def _worker(self) -> None:
        queries, close = await connect_queries(self.db, self.pgq_run)
        manager = QueueManager(queries)

        @manager.entrypoint("noop")
        async def noop(job) -> None:
            """Does nothing."""

        @manager.entrypoint("record_start")
        async def record_start(job) -> None:
            started = time.time()
            with open(os.environ["BENCH_LATENCY_FILE"], "a") as f:
                f.write(f"{job.payload.decode()} {started:.6f}\n")

        sleep_seconds = float(os.environ.get("BENCH_SLEEP_MS", "50")) / 1000

        @manager.entrypoint("async_sleep")
        async def async_sleep(job) -> None:
            """An I/O-bound job: awaits $BENCH_SLEEP_MS ms."""
            await asyncio.sleep(sleep_seconds)

        # The realistic job's own connections (of the worker's driver), C of
        # them (no cap: 10), handed out one per running job, as a pool would;
        # none for the async check's sleep jobs (its C of 200 would exceed the
        # server's sessions), nor for the ORM job (Django's connections instead).
        pool: asyncio.Queue = asyncio.Queue()
        size = 10 if self.defaults else max(2, self.args.concurrency)
        for _ in range(0 if self.args.sleep_ms or self.orm else size):
            pool.put_nowait(await (asyncpg.connect(self.db) if self.pgq_run else connect(self.db)))
        if self.orm:
            self._orm_entrypoint(manager)

        @manager.entrypoint("realistic")
        async def realistic(job) -> None:
            db, seq = await pool.get(), int(job.payload.decode())
            try:
                if self.pgq_run:
                    order_id = await db.fetchval(ASYNCPG_INSERT_SQL, seq)
                    await db.execute(ASYNCPG_UPDATE_SQL, order_id)
                else:
                    cursor = await db.execute(ORDER_INSERT_SQL, [seq])
                    (order_id,) = await cursor.fetchone()
                    await db.execute(ORDER_UPDATE_SQL, [order_id])
            finally:
                pool.put_nowait(db)

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, manager.shutdown.set)
        if self.defaults:
            await manager.run()
        else:
            concurrency = max(2, self.args.concurrency)
            await manager.run(batch_size=concurrency // 2, max_concurrent_tasks=concurrency)
        while not pool.empty():
            await pool.get_nowait().close()
        await close()

    def _orm_entrypoint(self, manager: QueueManager) -> None:
        """The realistic job as a Django site on PgQueuer writes it (see the docstring)."""
        from asgiref.sync import sync_to_async
        from bench.orders import place_order

        thread_sensitive = ORM_JOB[self.config]
        if not thread_sensitive:  # C threads, each with its own Django connection
            concurrency = max(2, self.args.concurrency)
            asyncio.get_running_loop().set_default_executor(
                ThreadPoolExecutor(concurrency, thread_name_prefix="orm")
            )
        body = sync_to_async(place_order, thread_sensitive=thread_sensitive)

        @manager.entrypoint("realistic_orm")
        async def realistic_orm(job) -> None:
            await body(int(job.payload.decode()))

    def close(self) -> None:
        if hasattr(self, "sync_conn"):
            self.sync_conn.close()
        if hasattr(self, "close_queries"):
            self.loop.run_until_complete(self.close_queries())
            self.loop.close()


if __name__ == "__main__":
    main(PgQueuerDriver)
