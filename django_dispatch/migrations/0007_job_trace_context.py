"""Job.trace_context: the enqueue's OpenTelemetry context (observability.tracing).

Nullable with no default: on PostgreSQL, adding it changes only the catalog,
never rewrites the job table, so it is safe on a big table under load.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_dispatch", "0006_workflowtask_verbose_name_step"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
