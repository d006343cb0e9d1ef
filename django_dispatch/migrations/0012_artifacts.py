"""Schema for #18 artifacts."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0011_flow_control")]

    operations: list[migrations.operations.base.Operation] = []
