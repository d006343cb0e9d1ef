"""The realistic job's row and its body: one INSERT and one UPDATE per job, through the ORM.

Unmanaged: the harness creates ``bench_order`` with the same SQL for every
system, Django or not (``harness.ORDER_TABLE_SQL``). ``place_order`` is the
job body of every system that runs it through Django's ORM: django_dispatch's
and django-tasks-db's ``bench.tasks.realistic``, and PgQueuer's ORM job rows
(``drivers/pgqueuer.py``, through ``asgiref.sync.sync_to_async``).
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


def place_order(seq: int) -> None:
    """What a typical job does to the site's database: create a row, then update it."""
    order = Order.objects.create(seq=seq, status="new")
    Order.objects.filter(pk=order.pk).update(status="done", updated_at=Now())
