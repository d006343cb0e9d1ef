"""The lost-timer sweep's index: waits with an end, by their end.

Without it, every sweep read every waiting step through the publish index
(``dispatch_wftask_waiting``) to find the few waits already over.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0013_queue_limits")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddIndex(
            model_name="workflowtask",
            index=models.Index(
                models.F("namespace"),
                models.F("wait_until"),
                condition=models.Q(("state", "waiting"), ("wait_until__isnull", False)),
                name="dispatch_wftask_wait_until",
            ),
        ),
    ]
