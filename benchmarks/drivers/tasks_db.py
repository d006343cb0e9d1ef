"""django-tasks-db: the same Django project and tasks on its ORM backend.

Its worker (``manage.py db_worker``) runs one task at a time per process and
has no concurrency option. Two configurations (``--config``):

- ``matched``: W x C worker processes, the same number of jobs in flight as
  the other systems (each a whole Django process: more memory);
- ``defaults``: W processes.

Both start with ``--no-startup-delay`` (its random start-up sleep of up to 1 s
would be counted as drain time) and ``--queue-name '*'`` (serve every queue);
other options are its defaults (1 s poll interval). It has no bulk enqueue API.
"""

from __future__ import annotations

import sys

from harness import Driver, main

from drivers import django_setup


class TasksDbDriver(Driver):
    unfinished_sql = (
        "SELECT count(*) FROM django_tasks_database_dbtaskresult "
        "WHERE status IN ('READY', 'RUNNING')"
    )
    CONFIGS = {
        "matched": "W x C processes, one task each",
        "defaults": "W processes, one task each",
    }

    def processes(self, workers: int, concurrency: int) -> int:
        return workers * concurrency if self.config == "matched" else workers

    def setup(self) -> None:
        django_setup.setup(self.db, "benchproject.settings_tasks_db")
        from bench import tasks

        self.tasks = tasks

    def enqueue_noop(self) -> None:
        self.tasks.noop.enqueue()

    def enqueue_record(self, seq: int) -> None:
        self.tasks.record_start.enqueue(seq)

    def enqueue_realistic_bulk(self, count: int) -> None:
        from django.db import transaction

        for start in range(0, count, 1000):  # no bulk API: one transaction per 1,000
            with transaction.atomic():
                for seq in range(start, min(count, start + 1000)):
                    self.tasks.realistic.enqueue(seq)

    def worker_argv(self, concurrency: int) -> list[str]:
        return [sys.executable, django_setup.manage_py(), "db_worker", "--queue-name", "*",
                "--settings", "benchproject.settings_tasks_db", "--no-reload",
                "--no-startup-delay"]  # fmt: skip

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


if __name__ == "__main__":
    main(TasksDbDriver)
