"""Writing an artifact's bytes: validation, the stored name, streaming with a hash.

Shared by ``context.save_artifact`` (jobs) and ``StepContext.save_artifact``
(workflow steps); the database writes are ``store.artifacts``'.

Order of a save, so that nothing is ever left untracked:

1. every argument is checked first: bad input raises before anything is
   written (no record, no file);
2. the record is inserted (unlinked);
3. the bytes are streamed into the storage, hashed as the storage reads them;
4. size, hash and the name the storage chose are recorded and the link is
   inserted in one transaction fenced by the attempt's lease or claim.

A crash or a storage error between 2 and 4, or a lost lease at 4, leaves an
unlinked record: the orphan sweep soft-deletes it and the purge deletes
whatever part of the file exists.

Stored names are ``dispatch/<namespace>/<owner kind>/<owner id>/<attempt>/<token>/<name>``
(the default namespace is ``_default``). The random token means two saves never
target the same name, even on storages that overwrite (S3 with
``file_overwrite``), so no artifact's file can replace another's; the name
the storage returns (it may pick another if the name is taken) is the one
recorded.
"""

from __future__ import annotations

import hashlib
import io
import mimetypes
import secrets
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages

from .. import store
from ..conf import get_settings
from ..models import Artifact, ArtifactLink
from ..models.artifact import LINK_NAME_MAX_LENGTH, Lifecycle
from ..store import artifacts as artifact_store

#: Finishes a save: (artifact id, {"name", "size", "sha256"}) -> the link, or
#: None when the attempt no longer holds its job or step.
Finisher = Callable[[int, dict[str, Any]], ArtifactLink | None]

CHUNK_SIZE = 64 * 1024


def storage_alias() -> str:
    """``DISPATCH["ARTIFACT_STORAGE"]``, checked against ``STORAGES``."""
    alias = get_settings().ARTIFACT_STORAGE
    known = list(getattr(settings, "STORAGES", {}) or {})
    if alias not in known:
        raise ImproperlyConfigured(
            f"DISPATCH['ARTIFACT_STORAGE'] is {alias!r}, which is not a key of STORAGES "
            f"({', '.join(map(repr, known)) or 'none'}); add it to STORAGES or name one of those"
        )
    return alias


def check_name(name: Any) -> str:
    """An artifact's name: 1 to 200 characters, relative path segments, no ``..``."""
    if not isinstance(name, str):
        raise TypeError(f"an artifact name must be a string, got {type(name).__name__}")
    if not name or len(name) > LINK_NAME_MAX_LENGTH:
        raise ValueError(
            f"an artifact name must have 1 to {LINK_NAME_MAX_LENGTH} characters, "
            f"got {len(name)}: give a short name such as 'report.pdf'"
        )
    segments = name.split("/")
    if "\x00" in name or "\\" in name or any(s in ("", ".", "..") for s in segments):
        raise ValueError(
            f"artifact name {name!r} is not a plain relative name: no leading or doubled '/', "
            "no '.' or '..' segment, no backslash or NUL"
        )
    return name


def check_content(content: Any) -> File:
    """``content`` as a Django ``File`` to stream from: bytes, or a binary file object."""
    if isinstance(content, bytes | bytearray | memoryview):
        return ContentFile(bytes(content))
    if isinstance(content, str):
        raise TypeError(
            "artifact content must be bytes or a binary file, got str: encode it "
            "(content.encode()) or open the file in 'rb' mode"
        )
    if isinstance(content, io.TextIOBase) or (
        isinstance(content, File) and isinstance(content.file, io.TextIOBase)
    ):
        raise TypeError("artifact content is a text file: open it in binary mode ('rb')")
    if not callable(getattr(content, "read", None)):
        raise TypeError(
            f"artifact content must be bytes or a binary file object, got {type(content).__name__}"
        )
    return content if isinstance(content, File) else File(content)


def check_expiry(expires_in: Any) -> float | None:
    if expires_in is None:
        return None
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float):
        raise TypeError(f"expires_in must be seconds (a number) or None, got {expires_in!r}")
    if expires_in < 0:
        raise ValueError(f"expires_in must be 0 or more seconds, got {expires_in!r}")
    return float(expires_in)


def check_content_type(content_type: Any, name: str) -> str:
    if content_type is None:
        return mimetypes.guess_type(name)[0] or "application/octet-stream"
    if not isinstance(content_type, str) or len(content_type) > 255:
        raise ValueError(
            f"content_type must be a string of at most 255 characters, got {content_type!r}"
        )
    return content_type


def stored_name(namespace: str, kind: str, owner_id: int, attempt: str, name: str) -> str:
    token = secrets.token_hex(8)
    return f"dispatch/{namespace or '_default'}/{kind}/{owner_id}/{attempt}/{token}/{name}"


class HashingFile(File):
    """A ``File`` that hashes and counts what the storage reads from it.

    Storages read either through ``chunks()`` (which seeks to 0, then reads)
    or ``read()``; both come through ``read`` here. A seek back to the start
    restarts the count (a storage that retries the upload); any other seek
    makes the running hash unusable, and the saver hashes the stored file
    instead. Never more than one chunk in memory.
    """

    def __init__(self, source: File) -> None:
        super().__init__(source.file, name=source.name)
        self._restart()

    def _restart(self) -> None:
        self.hasher = hashlib.sha256()
        self.count = 0
        self.sequential = True

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
        assert self.file is not None
        data = self.file.read(size)
        if isinstance(data, str):
            raise TypeError("artifact content is a text file: open it in binary mode ('rb')")
        self.hasher.update(data)
        self.count += len(data)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:  # type: ignore[override]
        assert self.file is not None
        position = self.file.seek(offset, whence)
        if offset == 0 and whence == io.SEEK_SET:
            self._restart()
        else:
            self.sequential = False
        return position


def _hash_stored(storage: Storage, name: str) -> tuple[int, str]:
    hasher, size = hashlib.sha256(), 0
    with storage.open(name, "rb") as f:
        for chunk in f.chunks(CHUNK_SIZE):
            hasher.update(chunk)
            size += len(chunk)
    return size, hasher.hexdigest()


def write(storage: Storage, target: str, source: File) -> dict[str, Any]:
    """Stream ``source`` into ``storage`` at ``target``: {"name", "size", "sha256"}."""
    hashing = HashingFile(source)
    written = storage.save(target, hashing, max_length=None)
    if hashing.sequential:
        size, digest = hashing.count, hashing.hasher.hexdigest()
    else:
        size, digest = _hash_stored(storage, written)
    return {"name": written, "size": size, "sha256": digest}


def save(
    *,
    namespace: str,
    kind: str,
    owner_id: int,
    attempt_dir: str,
    name: Any,
    content: Any,
    content_type: Any,
    durable: bool,
    expires_in: Any,
    finish: Finisher,
    lost: Callable[[], BaseException],
) -> Artifact:
    """Check everything, create the record, stream the bytes, link fenced (see the module)."""
    name = check_name(name)
    source = check_content(content)
    expiry = check_expiry(expires_in)
    content_type = check_content_type(content_type, name)
    alias = storage_alias()
    storage = storages[alias]
    artifact = artifact_store.artifact_create(
        storage=alias,
        name=stored_name(namespace, kind, owner_id, attempt_dir, name),
        namespace=namespace,
        content_type=content_type,
        lifecycle=Lifecycle.DURABLE if durable else Lifecycle.EPHEMERAL,
        expires_in=expiry,
    )
    try:
        stored = write(storage, artifact.name, source)
    except BaseException:
        # The purge deletes whatever part of the file was written.
        artifact_store.artifacts_soft_delete([artifact.pk])
        raise
    try:
        link = finish(artifact.pk, stored)
    except BaseException:
        artifact_store.artifacts_soft_delete([artifact.pk])  # refused: never linked
        raise
    if link is None:
        raise lost()  # unlinked: the orphan sweep's (the file is kept until then)
    return Artifact.objects.using(store.db_alias()).get(pk=artifact.pk)


def save_for_step(
    step_id: int,
    claim_id: str,
    generation: int,
    attempt: int,
    name: Any,
    content: Any,
    *,
    lost: Callable[[], BaseException],
    content_type: Any = None,
    durable: bool = False,
    expires_in: Any = None,
) -> Artifact:
    """``StepContext.save_artifact``: linked to the step, its generation and attempt,
    fenced by the step's claim (a replayed step starts a new generation, so its
    attempts never collide with the earlier generation's links)."""
    namespace = artifact_store.step_namespace(step_id)
    spec = artifact_store.LinkSpec("step", step_id, name, attempt, generation)

    def finish(artifact_id: int, stored: dict[str, Any]) -> ArtifactLink | None:
        return artifact_store.artifact_finish_step(
            step_id, claim_id, artifact_id, spec, stored=stored, namespace=namespace
        )

    return save(
        namespace=namespace,
        kind="step",
        owner_id=step_id,
        attempt_dir=f"g{generation}a{attempt}",
        name=name,
        content=content,
        content_type=content_type,
        durable=durable,
        expires_in=expires_in,
        finish=finish,
        lost=lost,
    )
