"""Changing artifacts from code: link one to another owner, update, soft-delete.

Each goes through ``store.artifacts`` (callers never write the tables
themselves) and says whether, or what, it changed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..models import Artifact, ArtifactLink
from ..models.artifact import Role
from ..queries.artifacts import get, owner_key
from ..store import artifacts as artifact_store
from ..tasks.artifact_files import check_name


def link(
    owner: Any, artifact: Artifact | int, name: str, *, role: str = "input", attempt: int = 0
) -> ArtifactLink:
    """Link an existing artifact to another owner: a step's input, a run's final
    output. Not fenced (no attempt is racing for it) and idempotent; a different
    artifact already linked under (owner, name, attempt) is ``ArtifactExists``."""
    if role not in Role.values:
        raise ValueError(f"role must be one of {Role.values}, got {role!r}")
    kind, owner_id = owner_key(owner)
    target = artifact if isinstance(artifact, Artifact) else get(int(artifact))
    spec = artifact_store.LinkSpec(kind, owner_id, check_name(name), attempt, role=role)
    return artifact_store.artifact_link(target.pk, spec, namespace=target.namespace)


def update(
    artifact: Artifact | int,
    *,
    size: int | None = None,
    sha256: str | None = None,
    content_type: str | None = None,
    expires_in: float | None = None,
    expires_at: datetime | None = None,
) -> Artifact:
    """Change a live artifact's size, hash, content type or expiry (nothing else may
    change); ``Artifact.DoesNotExist`` if it is not live. Returns the fresh record."""
    artifact_id = artifact.pk if isinstance(artifact, Artifact) else int(artifact)
    changes: dict[str, Any] = {
        k: v
        for k, v in {
            "size": size,
            "sha256": sha256,
            "content_type": content_type,
            "expires_at": expires_at,
        }.items()
        if v is not None
    }
    if size is not None and (not isinstance(size, int) or size < 0):
        raise ValueError(f"size must be 0 or more bytes, got {size!r}")
    if sha256 is not None and (len(sha256) != 64 or set(sha256) - set("0123456789abcdef")):
        raise ValueError("sha256 must be 64 lowercase hexadecimal digits")
    if expires_in is not None:
        if expires_in < 0:
            raise ValueError(f"expires_in must be 0 or more seconds, got {expires_in!r}")
        changes["expires_in"] = expires_in
    if changes and not artifact_store.artifact_update(artifact_id, **changes):
        raise Artifact.DoesNotExist(f"artifact {artifact_id} is not live")
    return get(artifact_id)


def delete(artifact: Artifact | int) -> bool:
    """Soft-delete a live artifact (its file is purged after the grace period);
    True when this call deleted it."""
    artifact_id = artifact.pk if isinstance(artifact, Artifact) else int(artifact)
    return artifact_store.artifacts_soft_delete([artifact_id]) == 1
