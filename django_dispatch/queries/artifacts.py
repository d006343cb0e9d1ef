"""Reading artifacts: what jobs and workflow steps saved with ``save_artifact``.

::

    from django_dispatch import artifacts

    report = artifacts.find(result.id, "report.pdf")   # the newest attempt's
    with artifacts.open(report) as f:
        ...

An *owner* is a job (its id, a ``TaskResult`` or a ``Job``), a
``WorkflowRun``, a workflow step (a ``WorkflowTask`` row), or an explicit
``("job" | "run" | "step", id)`` pair. Reads see live artifacts only, except
``get_record`` (soft-deleted ones too, until the purge). The writes an
operator or an application makes (link, update, delete) are
``services.artifacts``; ``django_dispatch.artifacts`` is the face of both.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.files import File
from django.core.files.storage import storages
from django.db.models import Model, QuerySet

from ..models import Artifact, ArtifactLink, Job, WorkflowRun, WorkflowTask
from ..models.artifact import OwnerKind
from ..store import read_database_for


def owner_key(owner: Any) -> tuple[str, int]:
    """``owner`` as (kind, id); ``TypeError`` for anything that is not an owner."""
    if isinstance(owner, tuple) and len(owner) == 2 and owner[0] in OwnerKind.values:
        return owner[0], int(owner[1])
    if isinstance(owner, WorkflowRun):
        return OwnerKind.RUN, int(owner.pk)
    if isinstance(owner, WorkflowTask):
        return OwnerKind.STEP, int(owner.pk)
    if isinstance(owner, Job):
        return OwnerKind.JOB, int(owner.pk)
    if isinstance(owner, int) and not isinstance(owner, bool):
        return OwnerKind.JOB, owner
    if isinstance(owner, str) and owner.isdigit():
        return OwnerKind.JOB, int(owner)
    result_id = getattr(owner, "id", None)  # a TaskResult
    if isinstance(result_id, str) and result_id.isdigit():
        return OwnerKind.JOB, int(result_id)
    raise TypeError(
        f"{owner!r} is not an artifact owner: pass a job id or TaskResult, a WorkflowRun, "
        "a WorkflowTask (step), or a ('job' | 'run' | 'step', id) pair"
    )


def links(owner: Any, *, role: str | None = None, live: bool = True) -> QuerySet[ArtifactLink]:
    """The owner's links with their artifacts, newest attempt first (for pages that
    show the attempt and role next to each artifact)."""
    kind, owner_id = owner_key(owner)
    query = (
        _rows(ArtifactLink).filter(owner_kind=kind, owner_id=owner_id).select_related("artifact")
    )
    if role is not None:
        query = query.filter(role=role)
    if live:
        query = query.filter(artifact__deleted_at=None)
    return query.order_by("-generation", "-attempt", "-created_at", "-id")


def _rows[M: Model](model: type[M]) -> QuerySet[M]:
    """``model``'s rows on the current alias's database (a worker's, an admin
    page's, a ``using_backend`` block's), else where the routers read them."""
    return model._default_manager.using(read_database_for(None, model))


def for_owner(owner: Any, role: str | None = None) -> list[Artifact]:
    """Live artifacts linked to ``owner`` (each once), newest attempt first."""
    seen: dict[int, Artifact] = {}
    for link in links(owner, role=role):
        seen.setdefault(link.artifact_id, link.artifact)
    return list(seen.values())


def find(owner: Any, name: str) -> Artifact | None:
    """The live artifact ``owner`` saved as ``name`` in its highest attempt
    (for a step: highest generation, then attempt); ties go to the newest."""
    link = links(owner).filter(name=name).first()
    return link.artifact if link is not None else None


def get(artifact_id: int) -> Artifact:
    """A live artifact; ``Artifact.DoesNotExist`` once soft-deleted or purged."""
    return _rows(Artifact).get(id=artifact_id, deleted_at=None)


def get_record(artifact_id: int) -> Artifact:
    """An artifact's record even after soft deletion (until the purge removes it)."""
    return _rows(Artifact).get(id=artifact_id)


def find_by_key(storage: str, name: str) -> Artifact | None:
    """The live artifact stored in ``STORAGES[storage]`` under ``name``, if any."""
    return _rows(Artifact).filter(storage=storage, name=name, deleted_at=None).first()


def open(artifact: Artifact | int, mode: str = "rb") -> File:
    """The artifact's file, opened through its storage (close it, or use ``with``)."""
    if not isinstance(artifact, Artifact):
        artifact = get(artifact)
    return storages[artifact.storage].open(artifact.name, mode)


@dataclass(frozen=True, slots=True)
class ArtifactPage:
    """One page of ``page()``: its artifacts, and the cursor of the next page (None: last)."""

    items: list[Artifact]
    next_before: int | None


def listing(
    *,
    namespace: str | None = None,
    storage: str | None = None,
    lifecycle: str | None = None,
    content_type: str | None = None,
    owner: Any = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    include_deleted: bool = False,
) -> QuerySet[Artifact]:
    """Artifacts matching every given filter, newest first."""
    query = _rows(Artifact).all()
    if not include_deleted:
        query = query.filter(deleted_at=None)
    filters: dict[str, Any] = {
        "namespace": namespace,
        "storage": storage,
        "lifecycle": lifecycle,
        "content_type": content_type,
        "created_at__gt": created_after,
        "created_at__lt": created_before,
    }
    query = query.filter(**{k: v for k, v in filters.items() if v is not None})
    if owner is not None:
        kind, owner_id = owner_key(owner)
        query = query.filter(links__owner_kind=kind, links__owner_id=owner_id).distinct()
    return query.order_by("-id")


def page(*, limit: int = 50, before: int | None = None, **filters: Any) -> ArtifactPage:
    """A page of ``listing(**filters)``, newest first; pass ``next_before`` on for the next.

    Keyset pagination on the id: a page costs the same however deep it is,
    and rows inserted meanwhile never shift it.
    """
    if not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ValueError(f"limit must be 1 to 1000, got {limit!r}")
    query = listing(**filters)
    if before is not None:
        query = query.filter(id__lt=before)
    items = list(query[: limit + 1])
    more = len(items) > limit
    items = items[:limit]
    return ArtifactPage(items, items[-1].pk if more else None)
