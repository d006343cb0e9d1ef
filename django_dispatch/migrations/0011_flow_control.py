"""Schema for #17 flow control: paused queues."""

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
    ]
