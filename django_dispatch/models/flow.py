"""Flow control state: which queues are paused.

A paused queue is a row here, not a flag in settings, so that a pause holds
across restarts and hosts and takes effect on every worker of the namespace
(see ``store.flow`` for how workers learn of it).
"""

from __future__ import annotations

from django.db import models

from .job import namespace_field

__all__ = ["ConcurrencyWait", "PausedQueue", "QueueWindow"]


class PausedQueue(models.Model):
    """One paused queue of one namespace: present while paused, deleted on resume.

    Presence rather than a boolean column, so that pausing is one INSERT whose
    unique constraint makes "did this call pause it" a fact the database
    decides, even with two operators pausing at once.
    """

    namespace = namespace_field()
    queue_name = models.CharField(max_length=100)
    paused_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "django_dispatch"
        ordering = ["queue_name"]
        # The admin's queue page lives at this model's changelist URL.
        verbose_name = "queue"
        verbose_name_plural = "queues"
        permissions = [("pause_queue", "Can pause and resume queues")]
        constraints = [
            models.UniqueConstraint("namespace", "queue_name", name="dispatch_paused_queue"),
        ]

    def __str__(self) -> str:
        return f"{self.queue_name} (paused)"


class ConcurrencyWait(models.Model):
    """A concurrency group (namespace, task, key) that has jobs blocked at its cap.

    A queue limited by ``DISPATCH["QUEUES"]`` is a group too: listed with
    ``task_path`` ``""`` (no task has an empty path) and the queue's name as
    ``concurrency_key``; its limits are read from settings when promoting,
    the ones stored here only say what they were when it filled up.

    Written by the claim in the transaction that blocks the group's excess
    jobs, under the group's lock; the claim promotes blocked jobs of the
    groups listed here as running ones end, and deletes a row once its group
    has no blocked job left (see ``store.flow``). So the claim finds the
    groups to promote without reading any blocked job, and a site without
    limits has no row here and pays nothing.
    """

    namespace = namespace_field()
    task_path = models.CharField(max_length=255)
    concurrency_key = models.CharField(max_length=255, blank=True)
    #: The group's caps, as its jobs carry them: running at once, and starts
    #: per window of ``rate_period`` seconds (None: no such cap).
    limit = models.PositiveIntegerField(null=True)
    rate_limit = models.PositiveIntegerField(null=True)
    rate_period = models.PositiveIntegerField(null=True)
    since = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "django_dispatch"
        constraints = [
            models.UniqueConstraint(
                "namespace", "task_path", "concurrency_key", name="dispatch_concurrency_wait"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} [{self.concurrency_key}] at its cap"


class QueueWindow(models.Model):
    """Starts of a rate-limited queue (``DISPATCH["QUEUES"]``) in its current window.

    A counter rather than a count of job rows: the jobs of a queue have no
    index by start time, and adding one would charge every claim of every
    site. It is exact because only the claim's gate admits a limited
    queue's jobs, under the queue's lock, and it adds its admissions here in
    the claim's own transaction (so a rolled-back claim counts nothing). A
    row whose ``window_start`` is not the current window's holds no start of
    it: the next admission resets it.
    """

    namespace = namespace_field()
    queue_name = models.CharField(max_length=100)
    window_start = models.DateTimeField()
    starts = models.PositiveIntegerField(default=0)

    class Meta:
        app_label = "django_dispatch"
        constraints = [
            models.UniqueConstraint("namespace", "queue_name", name="dispatch_queue_window"),
        ]

    def __str__(self) -> str:
        return f"{self.queue_name}: {self.starts} starts since {self.window_start}"
