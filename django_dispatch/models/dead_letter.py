"""Dead letters: jobs that failed for good, kept for a person to inspect and replay.

Written in the same transaction that marks the job failed, so a failure can
never exist without its dead letter. A replay is one compare-and-set on
``replayed_at``: of two concurrent replays exactly one wins.
"""

from django.db import models
from django.db.models.functions import Now

from .job import namespace_field


class DeadLetter(models.Model):
    id = models.BigAutoField(primary_key=True)
    #: The failed job's; a replay enqueues in it again.
    namespace = namespace_field()
    #: The failed job. No database constraint: retention may delete the job
    #: before its dead letter, and deleting jobs must not cascade here.
    job = models.ForeignKey(
        "django_dispatch.Job",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        null=True,
    )
    task_path = models.CharField(max_length=255)
    backend = models.CharField(max_length=100, default="default")
    queue_name = models.CharField(max_length=100)
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    partition_key = models.CharField(max_length=255, null=True, blank=True)
    #: Every attempt's error: exception_class_path, message, traceback.
    errors = models.JSONField(default=list)
    worker_ids = models.JSONField(default=list)
    #: The failed job's ``call_context``, kept for its replay: retention may
    #: delete the job before the dead letter.
    call_context = models.JSONField(null=True, blank=True)
    error_class = models.CharField(max_length=255, help_text="The last attempt's exception.")
    error_message = models.TextField(blank=True)
    enqueued_at = models.DateTimeField(help_text="When the failed job was first enqueued.")
    failed_at = models.DateTimeField(db_default=Now())

    # Replay history: who re-ran it, when, with which arguments, as which job.
    replayed_at = models.DateTimeField(null=True, blank=True)
    replayed_by = models.CharField(max_length=150, blank=True)
    replay_args = models.JSONField(null=True, blank=True)
    replay_kwargs = models.JSONField(null=True, blank=True)
    replay_job_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        app_label = "django_dispatch"
        ordering = ["-id"]
        permissions = [("replay_deadletter", "Can replay dead letters")]
        indexes = [
            models.Index("failed_at", name="dispatch_dl_failed_at"),
            models.Index("namespace", "failed_at", name="dispatch_dl_namespace"),
            models.Index("task_path", "failed_at", name="dispatch_dl_task"),
            models.Index("error_class", name="dispatch_dl_error_class"),
            # dead_letters.list/count (``queries.lists``): newest first by
            # id within one namespace, or of one task (``for_job`` reads the
            # ``job`` column's own index).
            models.Index("namespace", "id", name="dispatch_dl_list"),
            models.Index("namespace", "task_path", "id", name="dispatch_dl_list_task"),
            # The ones not replayed yet (the console's count, ``replayed=False``):
            # few beside the replayed ones, and read without visiting the rows.
            models.Index(
                "namespace",
                "id",
                name="dispatch_dl_unreplayed",
                condition=models.Q(replayed_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} (job {self.job_id}): {self.error_class}"
