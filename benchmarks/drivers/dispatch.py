"""django_dispatch: ``Task.enqueue()``, ``enqueue_many()`` and ``rundispatch``.

Extra measurements: the bare-ORM baseline (``Row.objects.create()`` of a row
as wide as a job, interleaved with enqueues), and the ``drain`` phase's
backlog options for the claim flatness check (``--prefill-finished``), the
partition check (``--partition-keys``) and the others below; the async
check's asyncio executor (``--async-concurrency``, #20); the atomic check's
``@task(atomic=True)`` twins of the no-op and realistic jobs (``--atomic``),
and the map check's one workflow run mapping a no-op child over ``--jobs``
inputs (``--map``).
"""

from __future__ import annotations

import os
import sys
import time

from harness import Driver, main

from drivers import django_setup

CHUNK = 10_000
MIXED_BIG_EVERY = 20  # --mixed-sizes: one 500 MB job per 20
ROUND = 200  # creates, then enqueues, per round of the ORM baseline

#: One million finished jobs in the shape the worker leaves them: succeeded,
#: with a lease epoch, attempt history and timestamps. They finished over the
#: last ~3 days, one every quarter second: within the default retention of
#: succeeded jobs (7 days), as in a busy site whose purge keeps up. (Spread
#: over 11 days, 40% of them were due for purging, and the leader's purge of
#: that backlog during the drain was measured instead of the claim.)
PREFILL_SQL = """
INSERT INTO django_dispatch_job (
    task_path, backend, queue_name, priority, args, kwargs, state, run_after,
    attempts, max_attempts, worker_lost_count, worker_id, lease_epoch,
    return_value, errors, worker_ids, enqueued_at, started_at, last_attempted_at,
    finished_at)
SELECT 'bench.tasks.noop', 'default', 'default', 0, '[]', '{}', 'succeeded',
    t, 1, 1, 0, 'prefill:1', 1, 'null', '[]', '["prefill:1"]', t, t, t, t
FROM (SELECT now() - n * interval '250 milliseconds' AS t
      FROM generate_series(1, %s) AS n) AS s
"""


#: Live jobs above the prefilled ones, found through the primary key, so that
#: polling stays cheap next to a million finished rows.
UNFINISHED_SQL = (
    "SELECT count(*) FROM django_dispatch_job "
    "WHERE id > {after} AND state IN ('pending', 'blocked', 'running')"
)

#: The map check: of ``items`` children, those not counted yet on the mapping
#: step (``map_done``, written after each child's success commits), plus one
#: while the parent run ``run`` has not succeeded (its fan-in done, its output
#: gathered). So the drain ends when the parent run succeeds, and counts down
#: one per child. Two lookups by primary key, the parent run and its step, as
#: the plain drain's poll reads the live jobs through an index: counting the
#: children's runs instead read all 10,000 of them at every poll (about 6 ms
#: of the server's time each, 0.4 ms per child over the drain), and so did a
#: lookup of the step by its run (planned on the statistics of the run's start,
#: when the step table held one row).
MAP_UNFINISHED_SQL = (
    "SELECT CASE WHEN (SELECT state FROM django_dispatch_workflowrun WHERE id = {run})"
    " = 'succeeded' THEN 0 ELSE {items} + 1 - COALESCE((SELECT map_done"
    " FROM django_dispatch_workflowtask WHERE id = {step}), 0) END"
)


class DispatchDriver(Driver):
    unfinished_sql = UNFINISHED_SQL.format(after=0)
    CONFIGS = {
        "matched": "W processes x C jobs in flight, Django's database defaults",
        "prepared": "the same, with psycopg's prepared statements on (prepare_threshold=5)",
    }

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--prefill-finished", type=int, default=0)
        parser.add_argument("--partition-keys", type=int, default=0)
        # #17: jobs spread over this many concurrency keys of a task with
        # concurrency_limit=--concurrency-limit (the claim's gate and its
        # blocked/promoted excess, against the plain drain).
        parser.add_argument("--concurrency-keys", type=int, default=0)
        parser.add_argument("--concurrency-limit", type=int, default=2)
        # #16: a backlog of mixed sizes (1 in MIXED_BIG_EVERY needs 500 MB, the
        # rest 20 MB) drained by workers with --capacity roomy enough that the
        # fit never idles a slot: the cost of the resource-aware claim itself.
        parser.add_argument("--mixed-sizes", action="store_true")
        parser.add_argument("--pending-backlog", type=int, default=0)
        # #20: slots for async def jobs on one event loop per process
        # (rundispatch --async-concurrency); 0: each takes a job thread.
        parser.add_argument("--async-concurrency", type=int, default=0)
        # #31: the no-op and the realistic backlogs as @task(atomic=True) twins
        # (bench.atomic_tasks): the body and the job's success in one transaction.
        parser.add_argument("--atomic", action="store_true")
        # #31: instead of --jobs no-op jobs, one workflow run whose step maps a
        # no-op child workflow over --jobs inputs (bench.workflows), started
        # before the workers are; the drain ends when that run has succeeded.
        parser.add_argument("--map", action="store_true")

    def setup(self) -> None:
        if self.config == "prepared":  # read by benchproject.settings, here and in the workers
            os.environ["BENCH_PREPARE"] = "1"
        django_setup.setup(self.db, "benchproject.settings")
        from bench import tasks

        self.tasks = tasks

    def enqueue_noop(self) -> None:
        self.tasks.noop.enqueue()

    def enqueue_record(self, seq: int) -> None:
        self.tasks.record_start.enqueue(seq)

    def enqueue_bulk(self, count: int) -> bool:
        from django_dispatch import enqueue_many

        enqueue_many(self.tasks.noop, [((), {})] * count)
        return True

    def enqueue_realistic_bulk(self, count: int) -> None:
        from django_dispatch import enqueue_many

        realistic = self.tasks.realistic
        if self.args.atomic:
            from bench.atomic_tasks import realistic_atomic as realistic
        for start in range(0, count, CHUNK):
            seqs = range(start, min(count, start + CHUNK))
            enqueue_many(realistic, [((seq,), {}) for seq in seqs])

    def enqueue_sleep_bulk(self, count: int) -> None:
        from django_dispatch import enqueue_many

        for start in range(0, count, CHUNK):
            enqueue_many(self.tasks.async_sleep, [((), {})] * min(CHUNK, count - start))

    def processes(self, workers: int, concurrency: int) -> int:
        """The asyncio executor's row: one ``rundispatch --processes W`` (see ``worker_argv``)."""
        return 1 if self.args.async_concurrency else workers

    def worker_argv(self, concurrency: int) -> list[str]:
        argv = [sys.executable, django_setup.manage_py(), "rundispatch",
                "--concurrency", str(concurrency)]  # fmt: skip
        if self.args.mixed_sizes:
            argv += ["--capacity", f"memory_mb={500 * concurrency}"]
        if self.args.async_concurrency:
            # As a site runs it: W processes forked by one command, each with its
            # C job threads for sync jobs beside the event loop.
            argv += ["--async-concurrency", str(self.args.async_concurrency),
                     "--processes", str(self.args.workers)]  # fmt: skip
        return argv

    def before(self) -> dict:
        """Bare ORM vs enqueue, interleaved in rounds so that drift hits both alike.

        ``Row.objects.create()`` of a row as wide as a job and ``noop.enqueue()``,
        one per transaction, as many of each as ``--jobs``. The jobs are then
        deleted, so that the standard measurements start from an empty queue.
        """
        from bench.models import Row
        from django.db import connection

        orm = enqueue = 0.0
        for start in range(0, self.args.jobs, ROUND):
            count = min(ROUND, self.args.jobs - start)
            started = time.perf_counter()
            for _ in range(count):
                Row.objects.create(task_path="bench.tasks.noop")
            orm += time.perf_counter() - started
            started = time.perf_counter()
            for _ in range(count):
                self.enqueue_noop()
            enqueue += time.perf_counter() - started
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE django_dispatch_job")
        return {
            "orm_create_per_s": self.args.jobs / orm,
            "paired_enqueue_per_s": self.args.jobs / enqueue,
        }

    def prepare_backlog(self) -> int:
        from django.db import connection, transaction

        from django_dispatch import enqueue_many

        if self.args.sleep_ms:
            return super().prepare_backlog()
        if self.args.map:
            return self.prepare_map()
        if self.args.prefill_finished:
            with connection.cursor() as cursor:
                cursor.execute(PREFILL_SQL, [self.args.prefill_finished])
                cursor.execute("VACUUM ANALYZE django_dispatch_job")
                cursor.execute("SELECT max(id) FROM django_dispatch_job")
                after = cursor.fetchone()[0]
            self.unfinished_sql = UNFINISHED_SQL.format(after=after)
        jobs, keys = self.args.jobs, self.args.partition_keys
        if self.args.pending_backlog:
            # A deep backlog: the drain is timed over its first ``jobs``
            # completions, so that a 10,000-job and a 1,000,000-job backlog
            # are measured over the same work.
            backlog = self.args.pending_backlog - jobs
            for start in range(0, backlog, 100_000):
                enqueue_many(self.tasks.noop, [((), {})] * min(100_000, backlog - start))
            self.unfinished_sql = (
                f"SELECT greatest(0, {jobs} - count(*)) FROM django_dispatch_job "
                "WHERE state = 'succeeded'"
            )
        if keys:
            # Round robin over the keys, as events of many customers arrive; one
            # transaction only to make the setup quick.
            with transaction.atomic():
                for index in range(jobs):
                    self.tasks.noop.using(partition_key=f"key-{index % keys}").enqueue()
        elif self.args.concurrency_keys:
            import dataclasses

            # noop itself runs; the rows carry the limit and the key (#17).
            capped = dataclasses.replace(
                self.tasks.noop, concurrency_limit=self.args.concurrency_limit
            )
            ckeys = self.args.concurrency_keys
            with transaction.atomic():
                for index in range(jobs):
                    capped.using(concurrency_key=f"key-{index % ckeys}").enqueue()
        elif self.args.mixed_sizes:
            small = self.tasks.noop.using(resources={"memory_mb": 20})
            big = self.tasks.noop.using(resources={"memory_mb": 500})
            for start in range(0, jobs, MIXED_BIG_EVERY):
                count = min(MIXED_BIG_EVERY, jobs - start)
                enqueue_many(small, [((), {})] * (count - 1))
                enqueue_many(big, [((), {})])
        else:
            noop = self.tasks.noop
            if self.args.atomic:
                from bench.atomic_tasks import noop_atomic as noop
            for start in range(0, jobs, CHUNK):
                enqueue_many(noop, [((), {})] * min(CHUNK, jobs - start))
        return jobs

    def prepare_map(self) -> int:
        """Start the run that maps a no-op child over ``--jobs`` inputs; its first step's
        job is the whole backlog, so creating the children is part of the timed drain."""
        from bench.workflows import fan_out

        from django_dispatch.models import WorkflowTask

        run = fan_out.start({"items": self.args.jobs})
        step = WorkflowTask.objects.get(run_id=run.pk).pk  # fan_out's one step
        self.unfinished_sql = MAP_UNFINISHED_SQL.format(items=self.args.jobs, run=run.pk, step=step)
        return self.args.jobs

    def bulk_scale(self) -> dict:
        """One ``enqueue_many`` call of ``--jobs`` rows: its rate and the memory it took."""
        import resource

        from django_dispatch import enqueue_many

        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        started = time.perf_counter()
        results = enqueue_many(self.tasks.noop, (((), {}) for _ in range(self.args.jobs)))
        elapsed = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        assert len(results) == self.args.jobs
        return {
            "rows": self.args.jobs,
            "rows_per_s": self.args.jobs / elapsed,
            "peak_rss_mb": peak,
            "rss_growth_mb": peak - before,
        }

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


if __name__ == "__main__":
    main(DispatchDriver)
