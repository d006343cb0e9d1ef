"""Every write to the artifact tables: create, link (fenced), update, soft delete, sweeps, purge.

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

The lifecycle sweeps (run by the leader, each bounded by ``batch``) only set
``deleted_at``; ``artifacts_purge`` deletes the file from storage first and
the row after, so a storage error keeps the row for the next sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.core.files.storage import Storage, storages
from django.db import IntegrityError, connections, transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now

from ..exceptions import ArtifactExists
from ..models import Artifact, ArtifactLink, Job, WorkflowRun, WorkflowTask
from ..models.artifact import Lifecycle, OwnerKind
from .base import db_alias, now_plus, take_sqlite_write_lock
from .claim import Lease
from .leases import _leased
from .workflows.common import claim_fence

logger = logging.getLogger("django_dispatch.store")

#: The fields ``artifact_update`` may change: what describes the bytes, and
#: how long they live. Where they are (storage, name) and who owns them never
#: change after creation.
UPDATABLE = frozenset({"size", "sha256", "content_type", "expires_at"})

_OWNER_MODELS: dict[str, Any] = {
    OwnerKind.JOB: Job,
    OwnerKind.RUN: WorkflowRun,
    OwnerKind.STEP: WorkflowTask,
}


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
    """Link an artifact to an owner, unfenced (from code that is not a worker's attempt,
    e.g. linking a run's artifact, or a step's input). Idempotent."""
    return _insert_link(_db(db), artifact_id, namespace, spec)


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


# --- soft deletion and the sweeps ---------------------------------------------------------


def artifacts_soft_delete(artifact_ids: Iterable[int], *, db: str | None = None) -> int:
    """Mark live artifacts deleted (their files go at the purge); how many were live."""
    return (
        Artifact.objects.using(_db(db))
        .filter(id__in=list(artifact_ids), deleted_at=None)
        .update(deleted_at=Now())
    )


def _soft_delete_batch(db: str, query: Any, batch: int) -> int:
    ids = list(query.order_by("id").values_list("id", flat=True)[:batch])
    return artifacts_soft_delete(ids, db=db) if ids else 0


def artifacts_sweep_expired(*, namespace: str = "", batch: int, db: str | None = None) -> int:
    """Soft-delete one batch of live artifacts past their expiry, durable ones included."""
    db = _db(db)
    expired = Artifact.objects.using(db).filter(
        namespace=namespace, deleted_at=None, expires_at__isnull=False, expires_at__lt=Now()
    )
    return _soft_delete_batch(db, expired, batch)


#: Rows a sweep reads per round, per ``batch`` it may soft-delete: the owner
#: and orphan sweeps walk their table by id in windows of ``batch * WINDOW``
#: rows (a primary-key range, whatever the table's size), so one round's
#: cost never grows with the number of live artifacts.
WINDOW = 10


@dataclass(frozen=True, slots=True)
class SweepCursor:
    """Where the owner and orphan sweeps go on next round (last id read; 0: start over)."""

    links: int = 0
    artifacts: int = 0


def artifacts_sweep_owner_gone(
    *, namespace: str = "", batch: int, after: int = 0, db: str | None = None
) -> tuple[int, int]:
    """Soft-delete the live ephemeral artifacts whose owner no longer exists, among
    the next window of links after id ``after``: (how many, the cursor for next time).

    Owners go away through retention (jobs), or with their run (steps).
    Owners are referenced by id, not foreign key, so their deletion does not
    cascade here: the window's owner ids are looked up, one query per kind.
    Durable artifacts are left alone. The cursor is 0 once the end is reached.
    """
    db = _db(db)
    window = list(
        ArtifactLink.objects.using(db)
        .filter(namespace=namespace, id__gt=after)
        .order_by("id")
        .values_list("id", "owner_kind", "owner_id", "artifact_id")[: batch * WINDOW]
    )
    by_kind: dict[str, set[int]] = {}
    for _, kind, owner_id, _ in window:
        by_kind.setdefault(kind, set()).add(owner_id)
    alive = {
        (kind, owner_id)
        for kind, ids in by_kind.items()
        for owner_id in _OWNER_MODELS[kind]
        .objects.using(db)
        .filter(id__in=list(ids))
        .values_list("id", flat=True)
    }
    gone = {artifact for _, kind, owner, artifact in window if (kind, owner) not in alive}
    done = 0
    if gone:
        done = (
            Artifact.objects.using(db)
            .filter(id__in=list(gone), deleted_at=None, lifecycle=Lifecycle.EPHEMERAL)
            .update(deleted_at=Now())
        )
    return done, (window[-1][0] if len(window) == batch * WINDOW else 0)


def artifacts_sweep_orphans(
    *, older_than: float, namespace: str = "", batch: int, after: int = 0, db: str | None = None
) -> tuple[int, int]:
    """Soft-delete the live ephemeral artifacts with no link, created more than
    ``older_than`` seconds ago, among the next window after id ``after``:
    (how many, the cursor for next time; 0 once the end is reached).

    These are files of attempts that lost their lease or crashed before
    linking. The cutoff must be longer than the longest write (an artifact is
    linked only once its file is written).
    """
    db = _db(db)
    window = list(
        Artifact.objects.using(db)
        .filter(
            namespace=namespace,
            deleted_at=None,
            lifecycle=Lifecycle.EPHEMERAL,
            created_at__lt=now_plus(-older_than),
            id__gt=after,
        )
        .order_by("id")
        .values_list("id", flat=True)[: batch * WINDOW]
    )
    if not window:
        return 0, 0
    orphans = (
        Artifact.objects.using(db)
        .filter(id__in=window)
        .filter(~Exists(ArtifactLink.objects.using(db).filter(artifact_id=OuterRef("id"))))
        .values_list("id", flat=True)
    )
    done = artifacts_soft_delete(list(orphans), db=db)
    return done, (window[-1] if len(window) == batch * WINDOW else 0)


def artifacts_purgeable(
    *, grace: float, namespace: str = "", batch: int, db: str | None = None
) -> list[Artifact]:
    """One batch of artifacts soft-deleted more than ``grace`` seconds ago, oldest first."""
    return list(
        Artifact.objects.using(_db(db))
        .filter(namespace=namespace, deleted_at__lt=now_plus(-grace))
        .order_by("deleted_at", "id")[:batch]
    )


def artifact_purge_one(
    artifact: Artifact,
    *,
    get_storage: Callable[[str], Storage] | None = None,
    db: str | None = None,
) -> bool:
    """Delete a soft-deleted artifact's file, then its record (links go with it).

    The file first: if the storage fails (or the alias is no longer in
    ``STORAGES``), the record stays, still soft-deleted, and the next sweep
    tries again. A live artifact is never purged. True when the record went.
    """
    if artifact.deleted_at is None:
        return False
    get_storage = get_storage or storages.__getitem__
    try:
        get_storage(artifact.storage).delete(artifact.name)
    except Exception:
        logger.warning(
            "artifact %s: could not delete %r from storage %r; kept for the next sweep",
            artifact.pk,
            artifact.name,
            artifact.storage,
            exc_info=True,
        )
        return False
    deleted, _ = (
        Artifact.objects.using(_db(db)).filter(id=artifact.pk, deleted_at__isnull=False).delete()
    )
    return deleted > 0


def artifacts_purge(
    *, grace: float, namespace: str = "", batch: int, db: str | None = None
) -> tuple[int, int]:
    """Purge one batch of soft-deleted artifacts; (purged, kept after a storage error)."""
    purged = failed = 0
    for artifact in artifacts_purgeable(grace=grace, namespace=namespace, batch=batch, db=db):
        if artifact_purge_one(artifact, db=db):
            purged += 1
        else:
            failed += 1
    return purged, failed


def artifacts_delete_now(artifact_ids: Iterable[int], *, db: str | None = None) -> tuple[int, int]:
    """Soft-delete, then purge at once (the admin's "delete now"): (purged, kept).

    Kept records (a storage error) stay soft-deleted for the leader's purge.
    """
    ids = list(artifact_ids)
    artifacts_soft_delete(ids, db=db)
    purged = failed = 0
    for artifact in Artifact.objects.using(_db(db)).filter(id__in=ids, deleted_at__isnull=False):
        if artifact_purge_one(artifact, db=db):
            purged += 1
        else:
            failed += 1
    return purged, failed


@dataclass(frozen=True, slots=True)
class SweepCounts:
    expired: int = 0
    owner_gone: int = 0
    orphans: int = 0
    purged: int = 0
    purge_failed: int = 0
    #: Where the windowed sweeps go on next round (pass it back in).
    cursor: SweepCursor = SweepCursor()

    @property
    def busy(self) -> bool:
        return any((self.expired, self.owner_gone, self.orphans, self.purged, self.purge_failed))


def artifacts_sweep(
    *,
    orphan_seconds: float,
    purge_grace: float,
    batch: int,
    namespace: str = "",
    cursor: SweepCursor | None = None,
    db: str | None = None,
) -> SweepCounts:
    """One bounded round of the whole lifecycle (the leader's duty).

    The expiry sweep and the purge read at most ``batch`` rows through their
    partial indexes; the owner and orphan sweeps read one window each (see
    ``WINDOW``), going on from ``cursor`` (the previous round's
    ``SweepCounts.cursor``), so a big table is covered over several rounds.
    """
    cursor = cursor or SweepCursor()
    expired = artifacts_sweep_expired(namespace=namespace, batch=batch, db=db)
    gone, links = artifacts_sweep_owner_gone(
        namespace=namespace, batch=batch, after=cursor.links, db=db
    )
    orphans, artifacts = artifacts_sweep_orphans(
        older_than=orphan_seconds, namespace=namespace, batch=batch, after=cursor.artifacts, db=db
    )
    purged, failed = artifacts_purge(grace=purge_grace, namespace=namespace, batch=batch, db=db)
    return SweepCounts(expired, gone, orphans, purged, failed, SweepCursor(links, artifacts))
