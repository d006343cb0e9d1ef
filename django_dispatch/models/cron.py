"""Cron entries: periodic jobs, declared in settings, made in code or created in the admin.

The scheduler claims a due entry with ``SELECT … FOR UPDATE SKIP LOCKED``,
enqueues its job(s) and advances ``last_slot``/``next_run_at`` in the same
transaction, so a slot fires exactly once whatever the number of schedulers;
each job also carries the idempotency key ``cron:<name>:<slot>``.
"""

from django.db import models
from django.db.models import Q

from ..core.cron import ALL, LATEST, SKIP
from .job import namespace_field


class CronEntry(models.Model):
    class Misfire(models.TextChoices):
        SKIP = SKIP, "Skip missed fires"
        LATEST = LATEST, "Run once for all missed fires"
        ALL = ALL, "Run every missed fire (capped)"

    class Source(models.TextChoices):
        SETTINGS = "settings", "DISPATCH['CRON'] setting"
        ADMIN = "admin", "Admin"
        #: ``schedules.save``: the settings sync never touches these.
        CODE = "code", "Code (schedules.save)"

    namespace = namespace_field()
    #: Unique per namespace (``dispatch_cron_name``).
    name = models.CharField(max_length=200)
    schedule = models.CharField(
        max_length=200, help_text="Cron expression: five fields, or six with seconds last."
    )
    timezone = models.CharField(max_length=64, help_text="IANA time zone, e.g. Europe/Paris.")
    task_path = models.CharField(max_length=255)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue_name = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0)
    enabled = models.BooleanField(default=True)
    misfire_policy = models.CharField(max_length=10, choices=Misfire.choices, default=SKIP)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.ADMIN)
    #: The watermark: every slot up to here has been dealt with (fired or
    #: skipped by the misfire policy). Database clock.
    last_slot = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True, help_text="Last slot fired.")
    next_run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "django_dispatch"
        ordering = ["name"]
        verbose_name_plural = "cron entries"
        indexes = [
            models.Index(
                "namespace", "next_run_at", name="dispatch_cron_due", condition=Q(enabled=True)
            ),
        ]
        constraints = [
            models.UniqueConstraint("namespace", "name", name="dispatch_cron_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.schedule} {self.timezone})"
