"""The artifacts admin: the list with filters, "delete now", downloads, and the
artifact tables shown on job, run and step pages (``artifacts_field``).

Rows are only written by ``store.artifacts``: no add or change page, and
deleting goes through "delete now", which deletes the file first and the
record after (a storage error keeps the record for the leader's purge).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.template.defaultfilters import filesizeformat
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join

from ..compat import admin_action
from ..models import Artifact, ArtifactLink, Job, WorkflowRun, WorkflowTask
from ..store import artifacts as artifact_store
from ..store import read_database_for
from .aliases import AliasSelector
from .artifact_download import download_artifact
from .common import (
    BOTH,
    BigTable,
    DeleteThroughAction,
    ReadOnlyRows,
    RecentValuesFilter,
    has_perm,
    link,
    selected_ids,
)

_OWNER_MODELS: dict[str, type[Model]] = {"job": Job, "run": WorkflowRun, "step": WorkflowTask}
#: Artifacts listed on one job, run or step page (the newest).
PAGE_LIMIT = 50


def download_url(artifact_id: int) -> str:
    return reverse("admin:django_dispatch_artifact_download", args=[artifact_id])


def artifacts_table(kind: str, owner_id: Any) -> str:
    """One line per live artifact of an owner: name, attempt, role, size, type, download."""
    rows = (
        ArtifactLink.objects.using(read_database_for(None, ArtifactLink))
        .filter(owner_kind=kind, owner_id=owner_id, artifact__deleted_at=None)
        .select_related("artifact")
        .order_by("-generation", "-attempt", "-created_at", "-id")[:PAGE_LIMIT]
    )
    lines = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                link(Artifact, r.artifact_id, r.name),
                f"{r.generation}.{r.attempt}" if kind == "step" else r.attempt,
                r.role,
                filesizeformat(r.artifact.size),
                r.artifact.content_type,
                format_html('<a href="{}">download</a>', download_url(r.artifact_id)),
            )
            for r in rows
        ),
    )
    if not lines:
        return "-"
    return format_html(
        "<table><thead><tr><th>Name</th><th>Attempt</th><th>Role</th><th>Size</th>"
        "<th>Type</th><th></th></tr></thead><tbody>{}</tbody></table>",
        lines,
    )


def artifacts_field(kind: str) -> Any:
    """A read-only field for the change page of a job, run or step (``kind``):
    ``artifacts_display = artifacts_field("job")`` plus the name in ``readonly_fields``."""

    @admin.display(description="Artifacts")
    def display(model_admin: Any, obj: Model) -> str:
        return artifacts_table(kind, obj.pk)

    return display


class LiveFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "live"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Live"), ("no", "Deleted (purge pending)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Artifact]) -> Any:
        if self.value() == "yes":
            return queryset.filter(deleted_at=None)
        if self.value() == "no":
            return queryset.filter(deleted_at__isnull=False)
        return queryset


@admin.register(Artifact)
class ArtifactAdmin(AliasSelector, ReadOnlyRows, DeleteThroughAction, BigTable):
    list_display = [
        "id",
        "name",
        "size_display",
        "content_type",
        "lifecycle",
        "storage",
        "created_at",
        "expires_at",
        "deleted_at",
        "download_link",
    ]
    list_filter = [
        LiveFilter,
        "lifecycle",
        ("storage", RecentValuesFilter),
        ("content_type", RecentValuesFilter),
        ("namespace", RecentValuesFilter),
    ]
    search_fields = ["id__exact", "name", "sha256__exact"]
    search_help_text = "Artifact id (exact), stored name, or SHA-256 (exact)."
    actions = ["delete_now"]
    fields = [
        ("id", "storage", "namespace"),
        "name",
        ("size", "content_type", "sha256"),
        ("lifecycle", "created_at", "expires_at", "deleted_at"),
        "owners",
        "download_link",
    ]
    readonly_fields = ["owners", "download_link"]

    def has_delete_now_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "delete_artifact_now")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # only through "delete now" (the file first, then the record)

    def get_urls(self) -> list[URLPattern]:
        download = path(
            "<int:artifact_id>/download/",
            self.admin_site.admin_view(download_artifact),
            name="django_dispatch_artifact_download",
        )
        return [download, *super().get_urls()]

    @admin.display(description="Size", ordering="size")
    def size_display(self, artifact: Artifact) -> str:
        return filesizeformat(artifact.size)

    @admin.display(description="Download")
    def download_link(self, artifact: Artifact) -> str:
        if artifact.deleted_at is not None:
            return "-"
        return format_html('<a href="{}">download</a>', download_url(artifact.pk))

    @admin.display(description="Linked to")
    def owners(self, artifact: Artifact) -> str:
        rows = artifact.links.order_by("-id")[:PAGE_LIMIT]
        return (
            format_html_join(
                ", ",
                "{} {} as {} (attempt {}, {})",
                (
                    (
                        r.get_owner_kind_display(),
                        link(_OWNER_MODELS[r.owner_kind], r.owner_id),
                        r.name,
                        r.attempt,
                        r.role,
                    )
                    for r in rows
                ),
            )
            or "- (unlinked: swept as an orphan unless durable)"
        )

    @admin_action(
        description="Delete selected artifacts now", permissions=["delete_now"], location=BOTH
    )
    def delete_now(self, request: HttpRequest, queryset: Any) -> None:
        purged, kept = artifact_store.artifacts_delete_now(list(selected_ids(queryset)))
        if kept:
            self.message_user(
                request,
                f"{purged} deleted; {kept} could not be deleted from their storage and are "
                "kept (marked deleted) for the next purge.",
                messages.WARNING,
            )
        else:
            self.message_user(request, f"{purged} deleted.", messages.SUCCESS)
