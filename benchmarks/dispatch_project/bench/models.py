"""A plain model as wide as ``django_dispatch.Job``: the bare-ORM enqueue baseline.

Same columns and types as the job row, but only a primary key: no partial
indexes, no check constraints, no NOTIFY trigger, no validation. Inserting one
with ``Row.objects.create()`` is what "an INSERT through the ORM" costs.
"""

from django.db import models
from django.db.models.functions import Now


class Row(models.Model):
    task_path = models.CharField(max_length=255)
    backend = models.CharField(max_length=100, default="default")
    queue_name = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    state = models.CharField(max_length=16, default="pending")
    run_after = models.DateTimeField(db_default=Now())
    deferred_until = models.DateTimeField(null=True)
    partition_key = models.CharField(max_length=255, null=True)
    idempotency_key = models.CharField(max_length=255, null=True)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    worker_lost_count = models.PositiveIntegerField(default=0)
    worker_id = models.CharField(max_length=100, null=True)
    lease_epoch = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True)
    heartbeat_at = models.DateTimeField(null=True)
    checkpoint = models.JSONField(null=True)
    return_value = models.JSONField(null=True)
    errors = models.JSONField(default=list)
    worker_ids = models.JSONField(default=list)
    enqueued_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True)
    last_attempted_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)


from .orders import Order  # noqa: E402  (the realistic job's row; unmanaged)

__all__ = ["Order", "Row"]
