"""Live worker processes, for operators: who is running, since when, seen when.

Jobs do not reference this table by foreign key, so deleting a stale worker
row never touches job rows.
"""

from django.db import models
from django.db.models.functions import Now

from .job import namespace_field


class Worker(models.Model):
    id = models.CharField(max_length=100, primary_key=True)
    #: The namespace this worker serves (``rundispatch --backend``).
    namespace = namespace_field()
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list, help_text="Empty: every queue.")
    concurrency = models.PositiveIntegerField()
    running_jobs = models.PositiveIntegerField(default=0)
    #: ``rundispatch --capacity`` of this process, or None: no capacity,
    #: so it runs only jobs without resource needs.
    capacity = models.JSONField(null=True, blank=True)
    locality = models.CharField(max_length=100, null=True, blank=True)
    started_at = models.DateTimeField(db_default=Now())
    last_seen_at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = "django_dispatch"
        ordering = ["id"]
        indexes = [models.Index("namespace", "last_seen_at", name="dispatch_worker_namespace")]

    def __str__(self) -> str:
        return self.id
