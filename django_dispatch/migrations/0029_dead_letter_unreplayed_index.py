"""The dead letters not replayed yet, indexed apart.

The console counts them on every load and ``dead_letters.count(replayed=False)``
/ ``list(replayed=False)`` read them: without this index the count walks
the table's rows, checking ``replayed_at`` on each, up to its cap; here it
reads index entries only.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0027_finish_wave")]

    operations = [
        migrations.AddIndex(
            model_name="deadletter",
            index=models.Index(
                models.F("namespace"),
                models.F("id"),
                name="dispatch_dl_unreplayed",
                condition=models.Q(replayed_at__isnull=True),
            ),
        ),
    ]
