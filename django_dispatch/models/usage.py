"""Per-attempt usage records: what each attempt of a job cost.

One row per attempt that ran task code (succeeded, failed, timed out,
interrupted, cancelled while running, or lost with its worker), written in
the same transaction as the attempt's outcome, so a job's outcome and its
usage record never disagree. Rows do not reference the job by foreign key:
the job's retention and the usage's retention are independent (an estimator
wants a task's history longer than its job rows are kept), and a purge of one
never cascades into the other.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F
from django.db.models.functions import Now

from .job import namespace_field

__all__ = ["JobUsage"]


class UsageOutcome(models.TextChoices):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # raised (retried or failed for good: the job's row says which)
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"  # the database connection broke under the task
    CANCELLED = "cancelled"  # cancelled while it ran
    WORKER_LOST = "worker_lost"  # recorded by the reclaim: what the job row knew


class JobUsage(models.Model):
    id = models.BigAutoField(primary_key=True)
    namespace = namespace_field()
    job_id = models.BigIntegerField(help_text="The job (no foreign key: kept past its purge).")
    task_path = models.CharField(max_length=255)
    queue_name = models.CharField(max_length=100, default="default")
    attempt = models.PositiveIntegerField(help_text="1 for the first attempt.")
    worker_id = models.CharField(max_length=100, blank=True, default="")
    host = models.CharField(max_length=255, blank=True, default="")
    outcome = models.CharField(max_length=16, choices=UsageOutcome.choices)
    #: When the attempt was leased (database clock: the claim's ``now()``).
    started_at = models.DateTimeField()
    #: When its outcome was written (database clock).
    finished_at = models.DateTimeField(db_default=Now())
    #: Wall time of the task code (monotonic clock of the worker); None for
    #: a lost worker's attempt, whose end nobody saw.
    wall_seconds = models.FloatField(null=True, blank=True)
    #: CPU seconds of the job's thread (``time.thread_time``); None when not
    #: measurable (async tasks run on a helper thread; lost or given-up attempts).
    cpu_seconds = models.FloatField(null=True, blank=True)
    #: The worker process's peak resident set size at the end of the attempt,
    #: in MiB (``getrusage().ru_maxrss``: a high-water mark since the process
    #: started, so an upper bound of what this attempt needed).
    peak_rss_mb = models.FloatField(null=True, blank=True)
    #: The resources the job held while it ran (its needs), or None.
    resources = models.JSONField(null=True, blank=True)

    class Meta:
        app_label = "django_dispatch"
        ordering = ["-finished_at", "-id"]
        verbose_name = "job usage"
        verbose_name_plural = "job usage"
        indexes = [
            # Per task, newest first: ``usage.records(task)``, ``summary`` and
            # ``resources="auto"`` read the newest N of one task.
            models.Index(
                "namespace", "task_path", F("finished_at").desc(), name="dispatch_usage_task"
            ),
            # Newest first globally, and the retention purge by age.
            models.Index("namespace", "finished_at", name="dispatch_usage_finished"),
            # One job's attempts (the job's admin page).
            models.Index("job_id", name="dispatch_usage_job"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} #{self.job_id} attempt {self.attempt} ({self.outcome})"
