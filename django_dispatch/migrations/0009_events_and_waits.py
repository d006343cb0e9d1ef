"""Schema for #15 events and durable waits."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_dispatch", "0008_namespaces")]

    operations: list[migrations.operations.base.Operation] = []
