"""The indexes of ``workflows.list_runs/count_runs``: a page of one namespace's
runs of a state or of a workflow reads only its own entries, newest first
(keyset on the id), however many runs there are. Creating them blocks writes
to the runs table meanwhile: on a large one, run ``migrate`` in a quiet moment.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_dispatch", "0019_job_call_context"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(
                models.F("namespace"),
                models.F("state"),
                models.F("id"),
                name="dispatch_wfrun_list_state",
            ),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(
                models.F("namespace"),
                models.F("name"),
                models.F("id"),
                name="dispatch_wfrun_list_name",
            ),
        ),
    ]
