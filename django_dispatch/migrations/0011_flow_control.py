"""Schema for #17 flow control: paused queues, concurrency and rate limits, unique_for,
partition_retry."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0010_usage_and_resources")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.CreateModel(
            name="PausedQueue",
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
                ("paused_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "verbose_name": "queue",
                "verbose_name_plural": "queues",
                "ordering": ["queue_name"],
                "permissions": [("pause_queue", "Can pause and resume queues")],
            },
        ),
        migrations.AddConstraint(
            model_name="pausedqueue",
            constraint=models.UniqueConstraint(
                models.F("namespace"), models.F("queue_name"), name="dispatch_paused_queue"
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_limit",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="partition_yield",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_limit",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_period",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("task_path"),
                models.F("concurrency_key"),
                models.F("state"),
                models.F("id"),
                condition=models.Q(
                    ("concurrency_key__isnull", False),
                    ("state__in", ["pending", "blocked", "running"]),
                ),
                name="dispatch_job_conc_live",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("task_path"),
                models.F("idempotency_key"),
                models.F("finished_at"),
                condition=models.Q(
                    ("idempotency_key__isnull", False),
                    ("state__in", ["succeeded", "failed", "cancelled"]),
                ),
                name="dispatch_job_key_finished",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("task_path"),
                models.F("concurrency_key"),
                models.F("last_attempted_at"),
                condition=models.Q(("rate_limit__isnull", False)),
                name="dispatch_job_rate_starts",
            ),
        ),
        migrations.CreateModel(
            name="ConcurrencyWait",
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
                ("task_path", models.CharField(max_length=255)),
                ("concurrency_key", models.CharField(blank=True, max_length=255)),
                ("limit", models.PositiveIntegerField(null=True)),
                ("rate_limit", models.PositiveIntegerField(null=True)),
                ("rate_period", models.PositiveIntegerField(null=True)),
                ("since", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        models.F("namespace"),
                        models.F("task_path"),
                        models.F("concurrency_key"),
                        name="dispatch_concurrency_wait",
                    )
                ],
            },
        ),
    ]
