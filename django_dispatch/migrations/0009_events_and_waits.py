"""Schema for #15: events, durable waits of workflow steps, a run's call context.

Additive only (a new table, nullable or defaulted columns, new indexes), so a
worker of the previous release keeps working during a rolling deploy.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

NAMESPACE_HELP = "The backend's OPTIONS['NAMESPACE'] (empty: the default namespace)."


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0008_namespaces")]

    operations = [
        migrations.CreateModel(
            name="Event",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "namespace",
                    models.CharField(
                        blank=True,
                        db_default="",
                        default="",
                        help_text=NAMESPACE_HELP,
                        max_length=63,
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                ("key", models.CharField(blank=True, max_length=255, null=True)),
                ("payload", models.JSONField(blank=True, null=True)),
                (
                    "published_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("acked_at", models.DateTimeField(blank=True, null=True)),
                ("lease_expires_at", models.DateTimeField(blank=True, null=True)),
                ("deliveries", models.PositiveIntegerField(default=0)),
            ],
            options={
                "ordering": ["-id"],
                "permissions": [("publish_event", "Can publish events")],
            },
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                models.F("namespace"),
                models.F("name"),
                models.F("id"),
                condition=models.Q(("acked_at__isnull", True)),
                name="dispatch_event_unacked",
            ),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                models.F("namespace"),
                models.F("name"),
                models.F("key"),
                models.F("published_at"),
                name="dispatch_event_key",
            ),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                models.F("namespace"),
                models.F("acked_at"),
                condition=models.Q(("acked_at__isnull", False)),
                name="dispatch_event_acked",
            ),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="call_context",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="wait_event_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="wait_event_name",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="wait_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="waits",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AlterField(
            model_name="workflowtask",
            name="state",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("ready", "Ready"),
                    ("running", "Running"),
                    ("waiting", "Waiting"),
                    ("succeeded", "Succeeded"),
                    ("skipped", "Skipped"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                ],
                default="pending",
                max_length=16,
            ),
        ),
        migrations.AddIndex(
            model_name="workflowtask",
            index=models.Index(
                models.F("namespace"),
                models.F("wait_event_name"),
                condition=models.Q(("state", "waiting")),
                name="dispatch_wftask_waiting",
            ),
        ),
    ]
