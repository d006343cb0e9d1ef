"""Schema for #18 artifacts: ``Artifact`` and ``ArtifactLink`` (see models/artifact.py).

Two new tables; nothing existing changes, so this migration is safe under a
rolling deploy (the previous release never reads them).
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


def _namespace() -> models.CharField:
    return models.CharField(
        blank=True,
        db_default="",
        default="",
        help_text="The backend's OPTIONS['NAMESPACE'] (empty: the default namespace).",
        max_length=63,
    )


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0011_flow_control")]

    operations = [
        migrations.CreateModel(
            name="Artifact",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("namespace", _namespace()),
                (
                    "storage",
                    models.CharField(
                        help_text="A key of Django's STORAGES setting.", max_length=100
                    ),
                ),
                (
                    "name",
                    models.CharField(
                        help_text="The name the storage keeps the file under.", max_length=1024
                    ),
                ),
                ("size", models.BigIntegerField(default=0, help_text="Bytes.")),
                ("sha256", models.CharField(blank=True, default="", max_length=64)),
                ("content_type", models.CharField(blank=True, default="", max_length=255)),
                (
                    "lifecycle",
                    models.CharField(
                        choices=[("ephemeral", "Ephemeral"), ("durable", "Durable")],
                        default="ephemeral",
                        max_length=16,
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("expires_at", models.DateTimeField(blank=True, null=True)),
                ("deleted_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("download_artifact", "Can download artifacts"),
                    ("delete_artifact_now", "Can delete artifacts now"),
                ],
                "indexes": [
                    models.Index(
                        models.F("namespace"),
                        models.F("expires_at"),
                        condition=models.Q(
                            ("deleted_at__isnull", True), ("expires_at__isnull", False)
                        ),
                        name="dispatch_artifact_expiry",
                    ),
                    models.Index(
                        models.F("namespace"),
                        models.F("created_at"),
                        condition=models.Q(
                            ("deleted_at__isnull", True), ("lifecycle", "ephemeral")
                        ),
                        name="dispatch_artifact_ephemeral",
                    ),
                    models.Index(
                        models.F("namespace"),
                        models.F("deleted_at"),
                        condition=models.Q(("deleted_at__isnull", False)),
                        name="dispatch_artifact_deleted",
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        models.F("storage"),
                        models.F("name"),
                        condition=models.Q(("deleted_at__isnull", True)),
                        name="dispatch_artifact_live_key",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("lifecycle__in", ["ephemeral", "durable"])),
                        name="dispatch_artifact_lifecycle",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("size__gte", 0)), name="dispatch_artifact_size"
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="ArtifactLink",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("namespace", _namespace()),
                (
                    "owner_kind",
                    models.CharField(
                        choices=[
                            ("job", "Job"),
                            ("run", "Workflow run"),
                            ("step", "Workflow step"),
                        ],
                        max_length=8,
                    ),
                ),
                ("owner_id", models.BigIntegerField()),
                ("name", models.CharField(max_length=200)),
                ("generation", models.PositiveIntegerField(default=0)),
                ("attempt", models.PositiveIntegerField(default=0)),
                (
                    "role",
                    models.CharField(
                        choices=[("output", "Output"), ("input", "Input"), ("log", "Log")],
                        default="output",
                        max_length=8,
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "artifact",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="links",
                        to="django_dispatch.artifact",
                    ),
                ),
            ],
            options={
                "ordering": ["-id"],
                "constraints": [
                    models.UniqueConstraint(
                        models.F("owner_kind"),
                        models.F("owner_id"),
                        models.F("name"),
                        models.F("generation"),
                        models.F("attempt"),
                        name="dispatch_artlink_owner_attempt",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("owner_kind__in", ["job", "run", "step"])),
                        name="dispatch_artlink_owner_kind",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("role__in", ["output", "input", "log"])),
                        name="dispatch_artlink_role",
                    ),
                ],
            },
        ),
    ]
