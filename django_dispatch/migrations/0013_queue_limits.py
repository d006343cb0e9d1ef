"""Schema for #17 queue-level limits (``DISPATCH["QUEUES"]``): the queue a job was set
aside by, with its index, and the per-queue start counter of rate-limited queues."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0012_artifacts")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.CreateModel(
            name="QueueWindow",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "namespace",
                    models.CharField(
                        blank=True,
                        db_default="",
                        default="",
                        help_text="The backend's OPTIONS['NAMESPACE'] (empty: the default namespace).",
                        max_length=63,
                    ),
                ),
                ("queue_name", models.CharField(max_length=100)),
                ("window_start", models.DateTimeField()),
                ("starts", models.PositiveIntegerField(default=0)),
            ],
        ),
        migrations.AddConstraint(
            model_name="queuewindow",
            constraint=models.UniqueConstraint(
                models.F("namespace"), models.F("queue_name"), name="dispatch_queue_window"
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="flow_queue",
            field=models.CharField(blank=True, max_length=100, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("flow_queue"),
                models.F("state"),
                models.F("id"),
                condition=models.Q(
                    ("flow_queue__isnull", False), ("state__in", ["pending", "blocked"])
                ),
                name="dispatch_job_queue_flow",
            ),
        ),
    ]
