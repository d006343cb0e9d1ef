"""Namespaces (issue 14): a ``namespace`` column on every table, in every key.

The column defaults to ``""`` (also in the database), so existing rows, and
statements that do not name it, stay in the default namespace: today's data
and behaviour. Every unique and partial index is recreated with the
namespace in it, and the claim index leads with it, so one namespace's
backlog is never read by another's claim.

On PostgreSQL the NOTIFY trigger notifies each inserted namespace's channel
(``store.base.notify_channel``): ``django_dispatch`` for the default
namespace, as before, ``django_dispatch_<16 hex digits of md5>`` otherwise,
so a job in one namespace never wakes an idle worker of another.
"""

from django.db import migrations, models

NOTIFY_BY_NAMESPACE = """
DROP TRIGGER IF EXISTS django_dispatch_job_notify ON django_dispatch_job;
CREATE OR REPLACE FUNCTION django_dispatch_notify() RETURNS trigger AS $$
DECLARE
    ns text;
BEGIN
    FOR ns IN SELECT DISTINCT namespace FROM new_rows LOOP
        PERFORM pg_notify(
            CASE WHEN ns = '' THEN 'django_dispatch'
                 ELSE 'django_dispatch_' || left(md5(ns), 16) END,
            ''
        );
    END LOOP;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER django_dispatch_job_notify
    AFTER INSERT ON django_dispatch_job
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION django_dispatch_notify();
"""

NOTIFY_ONE_CHANNEL = """
DROP TRIGGER IF EXISTS django_dispatch_job_notify ON django_dispatch_job;
CREATE OR REPLACE FUNCTION django_dispatch_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('django_dispatch', '');
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER django_dispatch_job_notify
    AFTER INSERT ON django_dispatch_job
    FOR EACH STATEMENT EXECUTE FUNCTION django_dispatch_notify();
"""


def notify_by_namespace(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(NOTIFY_BY_NAMESPACE)


def notify_one_channel(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(NOTIFY_ONE_CHANNEL)


class Migration(migrations.Migration):
    dependencies = [
        ("django_dispatch", "0007_job_trace_context"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="job",
            name="dispatch_job_one_running_per_partition",
        ),
        migrations.RemoveConstraint(
            model_name="job",
            name="dispatch_job_live_idempotency_key",
        ),
        migrations.RemoveConstraint(
            model_name="workflowrun",
            name="dispatch_wfrun_idempotency_key",
        ),
        migrations.RemoveIndex(
            model_name="cronentry",
            name="dispatch_cron_due",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="dispatch_job_claim",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="dispatch_job_lease",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="dispatch_job_finished",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="dispatch_job_part_live",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="dispatch_job_part_cancelling",
        ),
        migrations.RemoveIndex(
            model_name="workflowrun",
            name="dispatch_wfrun_state",
        ),
        migrations.RemoveIndex(
            model_name="workflowtask",
            name="dispatch_wftask_ready",
        ),
        migrations.RemoveIndex(
            model_name="workflowtask",
            name="dispatch_wftask_live",
        ),
        migrations.AddField(
            model_name="cronentry",
            name="namespace",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="The backend's OPTIONS['NAMESPACE'] (empty: the default namespace).",
                max_length=63,
            ),
        ),
        migrations.AddField(
            model_name="deadletter",
            name="namespace",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="The backend's OPTIONS['NAMESPACE'] (empty: the default namespace).",
                max_length=63,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="namespace",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="The backend's OPTIONS['NAMESPACE'] (empty: the default namespace).",
                max_length=63,
            ),
        ),
        migrations.AddField(
            model_name="leadership",
            name="namespace",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="The backend's OPTIONS['NAMESPACE'] (empty: the default namespace).",
                max_length=63,
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="namespace",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="The backend's OPTIONS['NAMESPACE'] (empty: the default namespace).",
                max_length=63,
            ),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="namespace",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="The backend's OPTIONS['NAMESPACE'] (empty: the default namespace).",
                max_length=63,
            ),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="namespace",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="The backend's OPTIONS['NAMESPACE'] (empty: the default namespace).",
                max_length=63,
            ),
        ),
        migrations.AlterField(
            model_name="cronentry",
            name="name",
            field=models.CharField(max_length=200),
        ),
        migrations.AlterField(
            model_name="leadership",
            name="name",
            field=models.CharField(max_length=120, primary_key=True, serialize=False),
        ),
        migrations.AddIndex(
            model_name="cronentry",
            index=models.Index(
                models.F("namespace"),
                models.F("next_run_at"),
                condition=models.Q(("enabled", True)),
                name="dispatch_cron_due",
            ),
        ),
        migrations.AddIndex(
            model_name="deadletter",
            index=models.Index(
                models.F("namespace"), models.F("failed_at"), name="dispatch_dl_namespace"
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("state", "pending")),
                name="dispatch_job_claim",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("lease_expires_at"),
                condition=models.Q(("state", "running")),
                name="dispatch_job_lease",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("partition_key"),
                models.F("id"),
                condition=models.Q(
                    ("partition_key__isnull", False),
                    ("state__in", ["pending", "blocked", "running"]),
                ),
                name="dispatch_job_part_live",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("partition_key"),
                condition=models.Q(("lease_expires_at__isnull", False), ("state", "cancelled")),
                name="dispatch_job_part_cancelling",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("namespace"),
                models.F("state"),
                models.F("finished_at"),
                condition=models.Q(("state__in", ["succeeded", "failed", "cancelled"])),
                name="dispatch_job_finished",
            ),
        ),
        migrations.AddIndex(
            model_name="worker",
            index=models.Index(
                models.F("namespace"), models.F("last_seen_at"), name="dispatch_worker_namespace"
            ),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(
                models.F("namespace"),
                models.F("state"),
                models.F("updated_at"),
                name="dispatch_wfrun_state",
            ),
        ),
        migrations.AddIndex(
            model_name="workflowtask",
            index=models.Index(
                models.F("namespace"),
                models.F("ready_at"),
                condition=models.Q(("state", "ready")),
                name="dispatch_wftask_ready",
            ),
        ),
        migrations.AddIndex(
            model_name="workflowtask",
            index=models.Index(
                models.F("namespace"),
                models.F("heartbeat_at"),
                condition=models.Q(("state__in", ["ready", "running"])),
                name="dispatch_wftask_live",
            ),
        ),
        migrations.AddConstraint(
            model_name="cronentry",
            constraint=models.UniqueConstraint(
                models.F("namespace"), models.F("name"), name="dispatch_cron_name"
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                models.F("namespace"),
                models.F("partition_key"),
                condition=models.Q(("partition_key__isnull", False), ("state", "running")),
                name="dispatch_job_one_running_per_partition",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                models.F("namespace"),
                models.F("task_path"),
                models.F("idempotency_key"),
                condition=models.Q(
                    ("idempotency_key__isnull", False),
                    ("state__in", ["pending", "blocked", "running"]),
                ),
                name="dispatch_job_live_idempotency_key",
            ),
        ),
        migrations.AddConstraint(
            model_name="workflowrun",
            constraint=models.UniqueConstraint(
                models.F("namespace"),
                models.F("name"),
                models.F("idempotency_key"),
                condition=models.Q(("idempotency_key__isnull", False)),
                name="dispatch_wfrun_idempotency_key",
            ),
        ),
        migrations.RunPython(notify_by_namespace, notify_one_channel),
    ]
