"""The realistic job's row: one INSERT and one UPDATE per job, through the ORM.

Unmanaged: the harness creates ``bench_order`` with the same SQL for every
system, Django or not (``harness.ORDER_TABLE_SQL``).
"""

from django.db import models
from django.db.models.functions import Now


class Order(models.Model):
    seq = models.IntegerField()
    status = models.CharField(max_length=16)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        managed = False
        db_table = "bench_order"
