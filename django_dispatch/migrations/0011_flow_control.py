"""Schema for #17 flow control."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0010_usage_and_resources")]

    operations: list[migrations.operations.base.Operation] = []
