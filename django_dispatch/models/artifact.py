"""Artifacts (files that jobs and workflow steps produce) and their links to owners.

An ``Artifact`` is one object kept in one of Django's ``STORAGES``: where it
is (storage alias, stored name), what it is (size, SHA-256, content type)
and how long it lives (``ephemeral`` or ``durable``, an optional expiry, a
soft deletion). An ``ArtifactLink`` says which owner (a job, a workflow run
or a workflow step) produced or used it, under which name, in which attempt.

Invariants kept by the database:

* one *live* artifact per (storage, stored name) (partial unique constraint):
  two concurrent creates at the same coordinates give one row, and the
  loser gets ``ArtifactExists``; a soft-deleted record no longer holds its
  name, so a purge pending on it never blocks a new file;
* one link per (owner, name, generation, attempt), which makes linking
  idempotent and keeps two attempts from overwriting each other's output.

Owners are referenced by kind and id, not by foreign key: a job purged by
retention must not take its artifacts' records with it (the leader's sweep
soft-deletes them, then purges their files first, so nothing is lost track
of). Only ``django_dispatch.store.artifacts`` writes these tables.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .job import namespace_field

__all__ = ["Artifact", "ArtifactLink"]

#: Longest stored name (the storage's own key: a path or an object key).
STORED_NAME_MAX_LENGTH = 1024
#: Longest link name, the name a task gives to ``save_artifact``.
LINK_NAME_MAX_LENGTH = 200


class Lifecycle(models.TextChoices):
    """``ephemeral``: swept with its owner, when it expires or when unlinked.
    ``durable``: kept until deleted by hand, or until its expiry if it has one."""

    EPHEMERAL = "ephemeral", "Ephemeral"
    DURABLE = "durable", "Durable"


class OwnerKind(models.TextChoices):
    JOB = "job", "Job"
    RUN = "run", "Workflow run"
    STEP = "step", "Workflow step"


class Role(models.TextChoices):
    OUTPUT = "output", "Output"
    INPUT = "input", "Input"
    LOG = "log", "Log"


class Artifact(models.Model):
    id = models.BigAutoField(primary_key=True)
    namespace = namespace_field()
    storage = models.CharField(max_length=100, help_text="A key of Django's STORAGES setting.")
    name = models.CharField(
        max_length=STORED_NAME_MAX_LENGTH, help_text="The name the storage keeps the file under."
    )
    size = models.BigIntegerField(default=0, help_text="Bytes.")
    sha256 = models.CharField(max_length=64, blank=True, default="")
    content_type = models.CharField(max_length=255, blank=True, default="")
    lifecycle = models.CharField(
        max_length=16, choices=Lifecycle.choices, default=Lifecycle.EPHEMERAL
    )
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField(null=True, blank=True)
    #: Set by a soft deletion; the file is deleted by the purge after a grace
    #: period, then the row.
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "django_dispatch"
        ordering = ["-id"]
        permissions = [
            ("download_artifact", "Can download artifacts"),
            ("delete_artifact_now", "Can delete artifacts now"),
        ]
        indexes = [
            # The expiry sweep: live artifacts with an expiry, by expiry.
            models.Index(
                "namespace",
                "expires_at",
                name="dispatch_artifact_expiry",
                condition=Q(deleted_at__isnull=True, expires_at__isnull=False),
            ),
            # The orphan sweep: live ephemeral artifacts by age.
            models.Index(
                "namespace",
                "created_at",
                name="dispatch_artifact_ephemeral",
                condition=Q(deleted_at__isnull=True, lifecycle="ephemeral"),
            ),
            # The purge: soft-deleted artifacts by deletion time.
            models.Index(
                "namespace",
                "deleted_at",
                name="dispatch_artifact_deleted",
                condition=Q(deleted_at__isnull=False),
            ),
        ]
        constraints = [
            # Not per namespace: a storage is one place, whatever instance
            # writes to it, so two namespaces must not claim one file.
            models.UniqueConstraint(
                "storage",
                "name",
                name="dispatch_artifact_live_key",
                condition=Q(deleted_at__isnull=True),
            ),
            models.CheckConstraint(
                condition=Q(lifecycle__in=Lifecycle.values), name="dispatch_artifact_lifecycle"
            ),
            models.CheckConstraint(condition=Q(size__gte=0), name="dispatch_artifact_size"),
        ]

    def __str__(self) -> str:
        return f"{self.storage}:{self.name}"

    @property
    def live(self) -> bool:
        return self.deleted_at is None


class ArtifactLink(models.Model):
    id = models.BigAutoField(primary_key=True)
    namespace = namespace_field()
    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="links")
    owner_kind = models.CharField(max_length=8, choices=OwnerKind.choices)
    owner_id = models.BigIntegerField()
    name = models.CharField(max_length=LINK_NAME_MAX_LENGTH)
    #: A workflow step's generation (bumped by each replay of its run, which
    #: restarts its attempts at 1); 0 for jobs and runs.
    generation = models.PositiveIntegerField(default=0)
    attempt = models.PositiveIntegerField(default=0)
    role = models.CharField(max_length=8, choices=Role.choices, default=Role.OUTPUT)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = "django_dispatch"
        ordering = ["-id"]
        constraints = [
            # Owner ids are primary keys, unique across namespaces already.
            models.UniqueConstraint(
                "owner_kind",
                "owner_id",
                "name",
                "generation",
                "attempt",
                name="dispatch_artlink_owner_attempt",
            ),
            models.CheckConstraint(
                condition=Q(owner_kind__in=OwnerKind.values), name="dispatch_artlink_owner_kind"
            ),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="dispatch_artlink_role"),
        ]

    def __str__(self) -> str:
        return f"{self.owner_kind} #{self.owner_id}: {self.name} (attempt {self.attempt})"
