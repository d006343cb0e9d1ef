"""The artifact lifecycle: soft deletion, the leader's sweeps, the purge.

Every sweep only sets ``deleted_at`` (expired artifacts; ephemeral ones
none of whose owners is left; ephemeral ones never linked); ``artifacts_purge``
deletes the file from storage first and the row after, so a storage error
keeps the row (still soft-deleted) for the next round and nothing is lost
track of. Each round is bounded: see ``WINDOW`` and ``artifacts_sweep``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.core.files.storage import Storage, storages
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now

from ..models import Artifact, ArtifactLink, Job, WorkflowRun, WorkflowTask
from ..models.artifact import Lifecycle, OwnerKind
from .base import db_alias, now_plus, take_sqlite_write_lock

logger = logging.getLogger("django_dispatch.store")

_OWNER_MODELS: dict[str, Any] = {
    OwnerKind.JOB: Job,
    OwnerKind.RUN: WorkflowRun,
    OwnerKind.STEP: WorkflowTask,
}


def _db(db: str | None) -> str:
    return db or db_alias()


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
    """Soft-delete one batch of live artifacts at or past their expiry, durable ones included.

    At, not only past: ``expires_in=0`` means expired now, and on SQLite's
    millisecond clock the sweep often reads the very instant it wrote.
    """
    db = _db(db)
    expired = Artifact.objects.using(db).filter(
        namespace=namespace, deleted_at=None, expires_at__isnull=False, expires_at__lte=Now()
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


def _alive_owners(db: str, links: list[tuple[int, str, int, int]]) -> set[tuple[str, int]]:
    """The (kind, owner id) pairs of ``links`` whose owner row still exists.

    Owners are referenced by id, not foreign key (their deletion does not
    cascade to links), so they are looked up: one query per kind.
    """
    by_kind: dict[str, set[int]] = {}
    for _, kind, owner_id, _ in links:
        by_kind.setdefault(kind, set()).add(owner_id)
    return {
        (kind, owner_id)
        for kind, ids in by_kind.items()
        for owner_id in _OWNER_MODELS[kind]
        .objects.using(db)
        .filter(id__in=list(ids))
        .values_list("id", flat=True)
    }


def _without_live_owner(db: str, candidates: set[int], page: int) -> set[int]:
    """Those of ``candidates`` with no link to an existing owner.

    All the candidates' links are read, ``page`` at a time, by link id; an
    artifact found with a live owner leaves the set at once (the next pages
    skip its links). At most ``WINDOW`` pages per round: an artifact whose
    links are not all read by then is kept this round (a later pass over its
    link decides), so a round stays bounded and nothing is deleted unchecked.
    """
    undecided = set(candidates)
    seen: set[int] = set()
    after = 0
    for _ in range(WINDOW):
        links = list(
            ArtifactLink.objects.using(db)
            .filter(artifact_id__in=list(undecided), id__gt=after)
            .order_by("id")
            .values_list("id", "owner_kind", "owner_id", "artifact_id")[:page]
        )
        alive = _alive_owners(db, links)
        seen.update(artifact for *_, artifact in links)
        undecided -= {artifact for _, kind, owner, artifact in links if (kind, owner) in alive}
        if len(links) < page or not undecided:
            return undecided & seen  # one with no link left at all is the orphan sweep's
        after = links[-1][0]
    return set()  # links left unread: keep them all this round


def artifacts_sweep_owner_gone(
    *, namespace: str = "", batch: int, after: int = 0, db: str | None = None
) -> tuple[int, int]:
    """Soft-delete the live ephemeral artifacts none of whose owners exists any
    more, among those linked in the next window of links after id ``after``:
    (how many, the cursor for next time; 0 once the end is reached).

    Owners go away through retention (jobs), or with their run (steps). One
    artifact may have several owners (``artifacts.link``: a run's final
    output, a step's input), kept for different times (a job for
    ``JOB_RETENTION``, its run for ``WORKFLOW_RETENTION``), so a link to a
    gone owner only makes its artifact a *candidate*: every link of the
    candidates is then checked, and only those with no live owner left are
    soft-deleted. Durable artifacts are left alone.

    A link being added concurrently is not missed: in one transaction the
    candidates are locked first (PostgreSQL: ``FOR UPDATE SKIP LOCKED``;
    SQLite: the write lock), then their links are read. Whoever links an
    artifact locks its row first, while it is live (``artifact_link``; a
    worker's ``_finish`` updates the row): a link committed before the sweep's
    lock is seen; one being inserted holds its artifact, which is skipped
    this round (SQLite: waited for); one started after waits for this
    commit, then finds the artifact deleted and links nothing.

    The links to gone owners are kept, not deleted: like every sweep this one
    only sets ``deleted_at`` (a wrong sweep can still be undone until the
    purge), the links record who made and used the artifact, and they do not
    pile up beyond it: the purge deletes them with the artifact's record.
    """
    db = _db(db)
    window = list(
        ArtifactLink.objects.using(db)
        .filter(namespace=namespace, id__gt=after)
        .order_by("id")
        .values_list("id", "owner_kind", "owner_id", "artifact_id")[: batch * WINDOW]
    )
    alive = _alive_owners(db, window)
    gone = {artifact for _, kind, owner, artifact in window if (kind, owner) not in alive}
    done = 0
    if gone:
        with transaction.atomic(using=db):
            take_sqlite_write_lock(db)
            locked = set(
                Artifact.objects.using(db)
                .filter(id__in=list(gone), deleted_at=None, lifecycle=Lifecycle.EPHEMERAL)
                .order_by("id")
                .select_for_update(skip_locked=True)
                .values_list("id", flat=True)
            )
            doomed = _without_live_owner(db, locked, batch * WINDOW) if locked else set()
            if doomed:
                done = artifacts_soft_delete(doomed, db=db)
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
