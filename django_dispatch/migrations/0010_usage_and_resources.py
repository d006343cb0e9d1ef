"""Schema for #16 resources, locality and usage."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0009_events_and_waits")]

    operations: list[migrations.operations.base.Operation] = []
