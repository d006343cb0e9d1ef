"""The ``scheduled`` state: deferred jobs wait out of the claim index.

A job whose ``run_after`` is in the future (a delayed enqueue, a retry
backing off) is ``scheduled`` until the stager makes it ``pending`` when due,
so the claim's index holds due jobs only. This migration widens the state's
check constraint and the partial indexes whose condition lists the live
states, adds the stager's index, and moves the deferred pending jobs already
queued to ``scheduled``, in batches of ``BATCH`` rows by id.

Locks: one transaction. Dropping and recreating the live-state indexes and
the idempotency constraint takes an ACCESS EXCLUSIVE lock on the job table
until the migration commits: claims, enqueues and heartbeats wait for it.
The batches bound each statement's size, not the lock's length. Run
``migrate`` in a quiet moment (CHANGELOG.md, "Upgrading").
"""

from django.db import migrations, models
from django.db.models.functions import Now

#: Deferred pending rows moved per UPDATE.
BATCH = 10_000

LIVE = ["pending", "blocked", "running", "scheduled"]


def _move(apps, schema_editor, src: str, dst: str, deferred_only: bool) -> None:
    Job = apps.get_model("django_dispatch", "Job")
    db = schema_editor.connection.alias
    last = 0
    while True:
        rows = Job.objects.using(db).filter(state=src, id__gt=last)
        if deferred_only:
            rows = rows.filter(run_after__gt=Now())
        ids = list(rows.order_by("id").values_list("id", flat=True)[:BATCH])
        if not ids:
            return
        Job.objects.using(db).filter(id__in=ids, state=src).update(state=dst)
        last = ids[-1]


def schedule_deferred(apps, schema_editor) -> None:
    _move(apps, schema_editor, "pending", "scheduled", deferred_only=True)


def unschedule(apps, schema_editor) -> None:
    # Back to what the previous claim reads: pending, deferred by run_after.
    _move(apps, schema_editor, "scheduled", "pending", deferred_only=False)


class Migration(migrations.Migration):
    dependencies = [
        ("django_dispatch", "0020_run_list_indexes"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="job", name="dispatch_job_state_valid"),
        migrations.RemoveConstraint(model_name="job", name="dispatch_job_live_idempotency_key"),
        migrations.RemoveIndex(model_name="job", name="dispatch_job_part_live"),
        migrations.RemoveIndex(model_name="job", name="dispatch_job_conc_next"),
        migrations.RemoveIndex(model_name="job", name="dispatch_job_list_live"),
        migrations.AlterField(
            model_name="job",
            name="state",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("scheduled", "Scheduled"),
                    ("blocked", "Blocked"),
                    ("running", "Running"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                ],
                default="pending",
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "state__in",
                        [
                            "pending",
                            "scheduled",
                            "blocked",
                            "running",
                            "succeeded",
                            "failed",
                            "cancelled",
                        ],
                    )
                ),
                name="dispatch_job_state_valid",
            ),
        ),
        migrations.RunPython(schedule_deferred, unschedule, elidable=False),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("state", "scheduled")),
                name="dispatch_job_scheduled",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("partition_key"),
                models.F("id"),
                condition=models.Q(("partition_key__isnull", False), ("state__in", LIVE)),
                name="dispatch_job_part_live",
            ),
        ),
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
                condition=models.Q(("concurrency_key__isnull", False), ("state__in", LIVE)),
                name="dispatch_job_conc_next",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("id"),
                condition=models.Q(("state__in", LIVE)),
                name="dispatch_job_list_live",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                models.F("namespace"),
                models.F("task_path"),
                models.F("idempotency_key"),
                condition=models.Q(("idempotency_key__isnull", False), ("state__in", LIVE)),
                name="dispatch_job_live_idempotency_key",
            ),
        ),
    ]
