"""Promotion in claim order: a limited group's (and a limited queue's) set-aside
jobs are made pending as the claim orders jobs, highest priority first, then
earliest ``run_after``, then oldest; they were promoted by age alone.

Two indexes replace ``dispatch_job_conc_live`` and ``dispatch_job_queue_flow``
with ``priority DESC, run_after`` before ``id``, so the promotion reads a
group's next blocked jobs in that order from the index instead of sorting the
group's whole backlog. The new ones are built first and the old ones dropped
last: ``CREATE INDEX`` blocks writes to the job table (enqueues, claims,
completions) while it builds, and reads go on; ``DROP INDEX`` blocks reads
too, but only from the drop to the commit, which follows at once.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0014_wait_until_index")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("task_path"),
                models.F("concurrency_key"),
                models.F("state"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(
                    ("concurrency_key__isnull", False),
                    ("state__in", ["pending", "blocked", "running"]),
                ),
                name="dispatch_job_conc_next",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("flow_queue"),
                models.F("state"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(
                    ("flow_queue__isnull", False), ("state__in", ["pending", "blocked"])
                ),
                name="dispatch_job_queue_next",
            ),
        ),
        migrations.RemoveIndex(model_name="job", name="dispatch_job_conc_live"),
        migrations.RemoveIndex(model_name="job", name="dispatch_job_queue_flow"),
    ]
