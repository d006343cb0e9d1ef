"""Workflows: per-step routing (a step's queue and priority) and ``ctx.map``'s
sets of child runs (the set on the waiting step, with its counters; each
child's set and position, unique together, and whether it was counted), and
the partial index through which the sweep finds the steps waiting for a set.

Every new column is nullable or has a default: adding them rewrites no row.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_dispatch", "0015_promotion_order"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="map_batch",
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="map_counted",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="map_index",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="map_batch",
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="map_done",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="map_max_parallel",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="map_started",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="map_total",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="priority",
            field=models.SmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowtask",
            name="queue_name",
            field=models.CharField(blank=True, max_length=100, null=True),
        ),
        migrations.AddConstraint(
            model_name="workflowrun",
            constraint=models.UniqueConstraint(
                models.F("map_batch"),
                models.F("map_index"),
                condition=models.Q(("map_batch__isnull", False)),
                name="dispatch_wfrun_map_item",
            ),
        ),
        migrations.AddIndex(
            model_name="workflowtask",
            index=models.Index(
                models.F("namespace"),
                models.F("map_batch"),
                condition=models.Q(("map_batch__isnull", False), ("state", "waiting")),
                name="dispatch_wftask_map",
            ),
        ),
    ]
