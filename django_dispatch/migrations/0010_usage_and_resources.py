"""Schema for #16 resources, locality and usage.

The claim index ``dispatch_job_claim`` is rebuilt partial on
``resource_shape IS NULL`` too: jobs with resource needs move to their own
index (``dispatch_job_claim_shaped``, led by the shape), so a worker without
capacity never reads past them, and one with capacity reads only the shapes
that fit. Every existing row has no needs, so it stays in the claim index.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

NAMESPACE_HELP = "The backend's OPTIONS['NAMESPACE'] (empty: the default namespace)."


def namespace() -> models.CharField:
    return models.CharField(
        blank=True, db_default="", default="", help_text=NAMESPACE_HELP, max_length=63
    )


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0009_events_and_waits")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.CreateModel(
            name="JobUsage",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("namespace", namespace()),
                (
                    "job_id",
                    models.BigIntegerField(
                        help_text="The job (no foreign key: kept past its purge)."
                    ),
                ),
                ("task_path", models.CharField(max_length=255)),
                ("queue_name", models.CharField(default="default", max_length=100)),
                (
                    "attempt",
                    models.PositiveIntegerField(help_text="1 for the first attempt."),
                ),
                ("worker_id", models.CharField(blank=True, default="", max_length=100)),
                ("host", models.CharField(blank=True, default="", max_length=255)),
                (
                    "outcome",
                    models.CharField(
                        choices=[
                            ("succeeded", "Succeeded"),
                            ("failed", "Failed"),
                            ("timed_out", "Timed Out"),
                            ("interrupted", "Interrupted"),
                            ("cancelled", "Cancelled"),
                            ("worker_lost", "Worker Lost"),
                        ],
                        max_length=16,
                    ),
                ),
                ("started_at", models.DateTimeField()),
                (
                    "finished_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("wall_seconds", models.FloatField(blank=True, null=True)),
                ("cpu_seconds", models.FloatField(blank=True, null=True)),
                ("peak_rss_mb", models.FloatField(blank=True, null=True)),
                ("resources", models.JSONField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "job usage",
                "verbose_name_plural": "job usage",
                "ordering": ["-finished_at", "-id"],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="locality",
            field=models.CharField(blank=True, max_length=100, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="resource_shape",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="resources",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="capacity",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="locality",
            field=models.CharField(blank=True, max_length=100, null=True),
        ),
        migrations.RemoveIndex(model_name="job", name="dispatch_job_claim"),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("resource_shape__isnull", True), ("state", "pending")),
                name="dispatch_job_claim",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("resource_shape"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("resource_shape__isnull", False), ("state", "pending")),
                name="dispatch_job_claim_shaped",
            ),
        ),
        migrations.AddIndex(
            model_name="jobusage",
            index=models.Index(
                models.F("namespace"),
                models.F("task_path"),
                models.OrderBy(models.F("finished_at"), descending=True),
                name="dispatch_usage_task",
            ),
        ),
        migrations.AddIndex(
            model_name="jobusage",
            index=models.Index(
                models.F("namespace"), models.F("finished_at"), name="dispatch_usage_finished"
            ),
        ),
        migrations.AddIndex(
            model_name="jobusage",
            index=models.Index(models.F("job_id"), name="dispatch_usage_job"),
        ),
    ]
