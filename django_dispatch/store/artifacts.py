"""Writes to the artifact tables: create, update, link (fenced); the lifecycle
(soft delete, sweeps, purge) is ``artifact_lifecycle``'s, re-exported here.

An artifact is created *before* its file is written (``artifact_create``) and
linked to its owner only after (``artifact_finish_job`` /
``artifact_finish_step``), so whatever happens in between (a crash, a
storage error, a lost lease) leaves a record, never an untracked file: the
record has no link, and the orphan sweep soft-deletes it, then the purge
deletes its file and the record. Nothing is ever lost track of.

Linking from a worker is fenced like every worker write: in one transaction,
the owner's row is locked while this exact claim still holds it (the job's
lease, or a step's claim id), then the link is inserted. An attempt that lost
its job to another worker links nothing.

The lifecycle sweeps (run by the leader, bounded per round) only set
``deleted_at``; ``artifacts_purge`` deletes the file from storage first and
the row after, so a storage error keeps the row for the next sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models.functions import Now

from ..exceptions import ArtifactExists
from ..models import Artifact, ArtifactLink, WorkflowTask
from ..models.artifact import Lifecycle
from .artifact_lifecycle import (
    SweepCounts,
    SweepCursor,
    artifact_purge_one,
    artifacts_delete_now,
    artifacts_purge,
    artifacts_purgeable,
    artifacts_soft_delete,
    artifacts_sweep,
    artifacts_sweep_expired,
    artifacts_sweep_orphans,
    artifacts_sweep_owner_gone,
)
from .base import db_alias, now_plus, take_sqlite_write_lock
from .leases import _leased
from .types import Lease
from .workflows.common import claim_fence

#: The fields ``artifact_update`` may change: what describes the bytes, and
#: how long they live. Where they are (storage, name) and who owns them never
#: change after creation.
UPDATABLE = frozenset({"size", "sha256", "content_type", "expires_at"})


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """Where to link an artifact: owner, name, (generation, attempt), role."""

    owner_kind: str
    owner_id: int
    name: str
    attempt: int
    generation: int = 0
    role: str = "output"


def _db(db: str | None) -> str:
    return db or db_alias()


# --- create, update, link ----------------------------------------------------------------


def artifact_create(
    *,
    storage: str,
    name: str,
    namespace: str = "",
    size: int = 0,
    sha256: str = "",
    content_type: str = "",
    lifecycle: str = Lifecycle.EPHEMERAL,
    expires_in: float | None = None,
    db: str | None = None,
) -> Artifact:
    """Insert a live artifact at (storage, name); ``ArtifactExists`` if one is there.

    The partial unique constraint decides between concurrent creates: exactly
    one INSERT commits, the other fails and gets ``ArtifactExists`` (on
    PostgreSQL it waits for the winner's commit first). ``expires_in`` is
    counted on the database clock.
    """
    db = _db(db)
    try:
        with transaction.atomic(using=db):
            return Artifact.objects.using(db).create(
                storage=storage,
                name=name,
                namespace=namespace,
                size=size,
                sha256=sha256,
                content_type=content_type,
                lifecycle=lifecycle,
                expires_at=None if expires_in is None else now_plus(expires_in),
            )
    except IntegrityError as e:
        if Artifact.objects.using(db).filter(storage=storage, name=name, deleted_at=None).exists():
            raise ArtifactExists(
                f"storage {storage!r} already holds a live artifact named {name!r}; pick "
                "another name, or delete that artifact first"
            ) from e
        raise


def artifact_update(artifact_id: int, *, db: str | None = None, **changes: Any) -> bool:
    """Change a live artifact's size, sha256, content type or expiry; True if it changed.

    Anything else is refused (``ValueError``): storage, name, lifecycle and
    owners are fixed at creation. ``expires_in`` (seconds from now, database
    clock) may be given instead of ``expires_at``.
    """
    if "expires_in" in changes:
        seconds = changes.pop("expires_in")
        changes["expires_at"] = None if seconds is None else now_plus(seconds)
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise ValueError(
            f"cannot update {sorted(unknown)} of an artifact; only {sorted(UPDATABLE)} may change"
        )
    if not changes:
        return False
    live = Artifact.objects.using(_db(db)).filter(id=artifact_id, deleted_at=None)
    return live.update(**changes) == 1


def _insert_link(
    db: str, artifact_id: int, namespace: str, spec: LinkSpec, *, supersede: bool = False
) -> ArtifactLink:
    """Insert the link, or return the same one if it is there already (idempotent).

    Another artifact linked under the same (owner, name, generation, attempt)
    is ``ArtifactExists``: one attempt never replaces its own output. Unless
    ``supersede``: the link was made by an earlier claim that carried the
    same attempt number (a job handed back at shutdown, or interrupted by
    the database, runs again without spending an attempt), so the current
    claim's artifact takes the link over, and the earlier one, unlinked, is
    left to the orphan sweep.
    """
    key = {
        "owner_kind": spec.owner_kind,
        "owner_id": spec.owner_id,
        "name": spec.name,
        "generation": spec.generation,
        "attempt": spec.attempt,
    }
    try:
        with transaction.atomic(using=db):
            return ArtifactLink.objects.using(db).create(
                artifact_id=artifact_id, namespace=namespace, role=spec.role, **key
            )
    except IntegrityError:
        existing = ArtifactLink.objects.using(db).filter(**key).first()
        if existing is None:
            raise
        if existing.artifact_id != artifact_id and supersede:
            ArtifactLink.objects.using(db).filter(id=existing.pk).update(
                artifact_id=artifact_id, role=spec.role, created_at=Now()
            )
            return ArtifactLink.objects.using(db).get(id=existing.pk)
        if existing.artifact_id != artifact_id:
            raise ArtifactExists(
                f"{spec.owner_kind} {spec.owner_id} already saved an artifact named "
                f"{spec.name!r} in attempt {spec.attempt}; use another name"
            ) from None
        return existing


def artifact_link(
    artifact_id: int, spec: LinkSpec, *, namespace: str = "", db: str | None = None
) -> ArtifactLink:
    """Link a live artifact to an owner, unfenced (from code that is not a worker's
    attempt, e.g. linking a run's artifact, or a step's input). Idempotent.

    The artifact's row is locked first (SQLite: the write lock), so the
    owner-gone sweep, which locks its candidates before reading their links,
    either sees this link or has soft-deleted the artifact before it lands:
    then ``Artifact.DoesNotExist``, nothing linked. (The foreign key's own
    check is deferred to the commit on PostgreSQL: it locks too late.)
    """
    db = _db(db)
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        live = Artifact.objects.using(db).filter(id=artifact_id, deleted_at=None)
        no_key = connections[db].vendor == "postgresql"  # see _no_key
        if not list(live.select_for_update(no_key=no_key).values_list("id", flat=True)):
            raise Artifact.DoesNotExist(f"artifact {artifact_id} is deleted; it cannot be linked")
        return _insert_link(db, artifact_id, namespace, spec)


def _finish(
    db: str,
    artifact_id: int,
    stored: dict[str, Any],
    fence: Any,
    namespace: str,
    spec: LinkSpec,
    supersede: bool = False,
) -> ArtifactLink | None:
    """Record what was written, then link it while ``fence`` still matches.

    One transaction: the owner's row is locked through the fence (SQLite: the
    write lock, taken first), so the claim cannot be taken over between the
    check and the insert. The record is updated even when the fence is lost:
    it stays accurate for the orphan sweep. (On PostgreSQL a fence check that
    lost may still lock the new row version until this short transaction
    ends, so a claim at that instant skips the job: the next poll takes it.)
    """
    with transaction.atomic(using=db):
        take_sqlite_write_lock(db)
        Artifact.objects.using(db).filter(id=artifact_id).update(**stored)
        fenced = fence.select_for_update(**_no_key(db)).values_list("id", flat=True)
        if not list(fenced):
            return None
        return _insert_link(db, artifact_id, namespace, spec, supersede=supersede)


def _no_key(db: str) -> dict[str, bool]:
    """FOR NO KEY UPDATE on PostgreSQL: conflicts with the takeover's UPDATE, not
    with inserts referencing the row."""
    return {"no_key": True} if connections[db].vendor == "postgresql" else {}


def artifact_finish_job(
    lease: Lease,
    artifact_id: int,
    spec: LinkSpec,
    *,
    stored: dict[str, Any],
    supersede: bool = False,
    db: str | None = None,
) -> ArtifactLink | None:
    """Record the written file and link it to the job, fenced by ``lease``; None if lost.

    ``supersede``: this claim did not save ``spec.name`` yet, so a link already
    there under its attempt number is an earlier claim's (see ``_insert_link``).
    """
    db = _db(db)
    fence = _leased(lease, db)
    return _finish(db, artifact_id, stored, fence, lease.namespace, spec, supersede)


def artifact_finish_step(
    step_id: int,
    claim_id: str,
    artifact_id: int,
    spec: LinkSpec,
    *,
    stored: dict[str, Any],
    namespace: str = "",
    db: str | None = None,
) -> ArtifactLink | None:
    """Record the written file and link it to the step, fenced by its claim; None if lost."""
    db = _db(db)
    return _finish(db, artifact_id, stored, claim_fence(db, step_id, claim_id), namespace, spec)


def step_namespace(step_id: int, *, db: str | None = None) -> str:
    """A step's namespace (its run's), for the stored name of its artifacts."""
    return (
        WorkflowTask.objects.using(_db(db))
        .filter(id=step_id)
        .values_list("namespace", flat=True)
        .first()
        or ""
    )


__all__ = [
    "LinkSpec",
    "SweepCounts",
    "SweepCursor",
    "artifact_create",
    "artifact_finish_job",
    "artifact_finish_step",
    "artifact_link",
    "artifact_purge_one",
    "artifact_update",
    "artifacts_delete_now",
    "artifacts_purge",
    "artifacts_purgeable",
    "artifacts_soft_delete",
    "artifacts_sweep",
    "artifacts_sweep_expired",
    "artifacts_sweep_orphans",
    "artifacts_sweep_owner_gone",
    "step_namespace",
]
