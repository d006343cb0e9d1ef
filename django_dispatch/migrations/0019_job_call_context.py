"""``Job.call_context``: who or what enqueued a job (a JSON object, or NULL),
and ``DeadLetter.call_context``, the failed job's, which its replay carries.

Nullable columns without a default: on PostgreSQL adding one changes only the
catalog (no row is rewritten, the lock is held for an instant), and on SQLite
it is an ``ALTER TABLE ADD COLUMN``. No index: the admin's filter and search
read it on the page's rows, and nothing claims by it.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0017_list_indexes")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="call_context",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="deadletter",
            name="call_context",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
