"""The indexes of ``jobs.list/count`` and ``dead_letters.list/count``; cron
entries made in code (``schedules.save``) get their own origin, ``code``; events
nobody acked are purged oldest first (``EVENT_UNACKED_RETENTION``).

Each leads with the namespace and ends with the id, so a page of one
namespace's finished jobs of a state, a queue or a task (newest first,
keyset on the id) reads only its own entries, however long the history. They
are partial on finished states (live jobs have one index of their own), so
the claim's and the limits' queries, all on live jobs, never pick them. On a large job
table, creating them takes a while and blocks writes to it meanwhile: run
``migrate`` in a quiet moment.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0018_map_and_step_routing")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("state"),
                models.F("id"),
                condition=models.Q(("state__in", ["succeeded", "failed", "cancelled"])),
                name="dispatch_job_list_state",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("queue_name"),
                models.F("id"),
                condition=models.Q(("state__in", ["succeeded", "failed", "cancelled"])),
                name="dispatch_job_list_queue",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("task_path"),
                models.F("id"),
                condition=models.Q(("state__in", ["succeeded", "failed", "cancelled"])),
                name="dispatch_job_list_task",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("id"),
                condition=models.Q(("state__in", ["pending", "blocked", "running"])),
                name="dispatch_job_list_live",
            ),
        ),
        migrations.AddIndex(
            model_name="deadletter",
            index=models.Index(models.F("namespace"), models.F("id"), name="dispatch_dl_list"),
        ),
        migrations.AddIndex(
            model_name="deadletter",
            index=models.Index(
                models.F("namespace"),
                models.F("task_path"),
                models.F("id"),
                name="dispatch_dl_list_task",
            ),
        ),
        migrations.AlterField(
            model_name="cronentry",
            name="source",
            field=models.CharField(
                choices=[
                    ("settings", "DISPATCH['CRON'] setting"),
                    ("admin", "Admin"),
                    ("code", "Code (schedules.save)"),
                ],
                default="admin",
                max_length=10,
            ),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                models.F("namespace"),
                models.F("published_at"),
                condition=models.Q(("acked_at__isnull", True)),
                name="dispatch_event_unacked_age",
            ),
        ),
    ]
