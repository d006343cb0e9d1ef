"""Raw psycopg on a bare table: the ceiling of this machine and server.

No framework, no lease, no history: a worker claims pending rows with
``FOR UPDATE SKIP LOCKED`` and marks them done in the same statement (so one
transaction), ``--batch`` rows at a time, until none are left. Enqueue is a
plain INSERT per transaction; bulk enqueue is COPY. The 100-per-transaction
drain runs on ten times ``--jobs``: it is so fast that fewer would end
within a few polls.
"""

from __future__ import annotations

import sys

import psycopg
from harness import Driver, main, measure_bulk, measure_drain, measure_enqueue

SCHEMA = """
CREATE TABLE raw_job (
    id bigserial PRIMARY KEY,
    state text NOT NULL DEFAULT 'pending',
    task_path text NOT NULL,
    args jsonb NOT NULL DEFAULT '[]',
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX raw_job_pending ON raw_job (id) WHERE state = 'pending';
"""

CLAIM_AND_COMPLETE = """
UPDATE raw_job SET state = 'done', finished_at = now()
WHERE id IN (SELECT id FROM raw_job WHERE state = 'pending'
             ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
"""


class RawDriver(Driver):
    unfinished_sql = "SELECT count(*) FROM raw_job WHERE state = 'pending'"

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--batch", type=int, default=1, help="jobs per transaction")

    def setup(self) -> None:
        self.conn = psycopg.connect(self.db, autocommit=True)
        self.conn.execute(SCHEMA)

    def enqueue_noop(self) -> None:
        self.conn.execute("INSERT INTO raw_job (task_path) VALUES ('noop')")

    def enqueue_bulk(self, count: int) -> bool:
        with self.conn.cursor().copy("COPY raw_job (task_path) FROM STDIN") as copy:
            for _ in range(count):
                copy.write_row(("noop",))
        return True

    def worker_argv(self, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "drivers.raw", "worker", "--batch", str(self.args.batch)]

    def standard(self, conn, logdir) -> dict:
        """Enqueue and bulk rates, then the drain at 1 and at 100 jobs per transaction."""
        jobs = self.args.jobs
        result = {"enqueue_per_s": measure_enqueue(self, jobs)}
        self.args.batch = 1
        result["batch1"] = measure_drain(self, conn, jobs, logdir)
        result["bulk_per_s"] = measure_bulk(self, self.args.bulk_jobs)
        conn.execute("TRUNCATE raw_job")
        self.enqueue_bulk(10 * jobs)  # ten times more, or it ends before the first poll
        self.args.batch = 100
        result["batch100"] = measure_drain(self, conn, 10 * jobs, logdir)
        return result

    def run_worker(self) -> None:
        with psycopg.connect(self.db, autocommit=True) as conn:
            while conn.execute(CLAIM_AND_COMPLETE, [self.args.batch]).rowcount:
                pass

    def close(self) -> None:
        if hasattr(self, "conn"):
            self.conn.close()


if __name__ == "__main__":
    main(RawDriver)
