"""The indexes of the admin's job list: finished jobs of a state, a queue or a task,
newest first, in every namespace (the list indexes of ``jobs.list`` lead with
one namespace, which the admin does not filter on). A page of a rare queue
then reads its own entries instead of the history until its page is full.

Partial on finished states: a job enters each once, when it finishes, and
no query of the claim or of the limits can pick them. Creating them blocks
writes to the job table meanwhile (about a minute per 10,000,000 rows): on a
large one, run ``migrate`` in a quiet moment.
"""

from django.db import migrations, models

FINISHED = models.Q(state__in=["succeeded", "failed", "cancelled"])


class Migration(migrations.Migration):
    dependencies = [
        ("django_dispatch", "0021_scheduled_state"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F(column),
                models.F("id"),
                condition=FINISHED,
                name=f"dispatch_job_admin_{name}",
            ),
        )
        for column, name in [("state", "state"), ("queue_name", "queue"), ("task_path", "task")]
    ]
