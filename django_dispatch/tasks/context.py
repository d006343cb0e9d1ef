"""The TaskContext given to ``@task(takes_context=True)`` functions."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

from .. import store
from ..compat import InvalidTask, TaskContext
from ..exceptions import ArtifactExists, JobCancelled
from ..models.artifact import Artifact, OwnerKind
from ..store import artifacts as artifact_store
from ..store.artifacts import LinkSpec
from ..store.leases import job_is_leased
from . import artifact_files
from .values import to_json


# django-stubs declares TaskContext non-frozen; Django's own class is frozen.
@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchTaskContext(TaskContext):  # type: ignore[misc]
    """``django.tasks.TaskContext`` plus a resume cursor.

    ``checkpoint`` is the last value saved with ``progress()`` by this or an
    earlier attempt (None at first), so a retried or reclaimed job resumes
    where it stopped instead of starting over.
    """

    lease: store.Lease
    lease_seconds: float
    cancel_event: threading.Event = field(default_factory=threading.Event)
    saved_checkpoint: Any = None
    #: Artifact names this claim saved: a second save of one is ``ArtifactExists``;
    #: a first one takes over a link an earlier claim of the same attempt number made.
    saved_artifacts: set[str] = field(default_factory=set)
    #: Whether the final checkpoint of a cancelled attempt was tried: it is
    #: saved once, by the first ``progress()`` that finds the job cancelled.
    final_tried: bool = False
    #: An ``atomic=True`` task: its body runs in the transaction that writes
    #: its success, which must not write or lock the job's row before then.
    atomic: bool = False
    #: Who or what enqueued the job (``Job.call_context``): a dict, or None.
    call_context: dict[str, Any] | None = None

    @property
    def checkpoint(self) -> Any:
        return self.saved_checkpoint

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled, timed out or lost by this worker.

        Cheap to poll (no database access); ``progress()`` checks the
        database itself.
        """
        return self.cancel_event.is_set()

    def progress(self, value: Any) -> None:
        """Persist ``value`` (JSON) as the resume cursor and renew the lease.

        Raises ``JobCancelled`` once the job is cancelled or this worker no
        longer holds it: stop work then; whatever the task returns afterwards
        is discarded. On a job cancelled while it runs, the first such call
        still saves ``value`` as the job's final checkpoint (fenced by the
        lease, once), so the work done since the last ``progress()`` is on
        record. Raises ``InvalidTaskArguments``, saving nothing, when
        ``value`` is not JSON or its JSON is over
        ``DISPATCH["MAX_CHECKPOINT_BYTES"]``. From async tasks use
        ``await context.aprogress(value)``. In an ``atomic=True`` task it
        saves nothing (see ``_still_held``): it only raises ``JobCancelled``
        once this worker no longer holds the job.
        """
        if self.cancel_event.is_set() and self.final_tried:
            raise JobCancelled(self._gone())
        value = to_json(value, "A checkpoint", "MAX_CHECKPOINT_BYTES")
        if self.atomic:
            self._still_held()
            return
        if not self.cancel_event.is_set():
            if store.job_progress_if_leased(self.lease, value, lease_seconds=self.lease_seconds):
                object.__setattr__(self, "saved_checkpoint", value)
                return
            self.cancel_event.set()
        object.__setattr__(self, "final_tried", True)
        if store.job_final_checkpoint_if_cancelled(self.lease, value):
            object.__setattr__(self, "saved_checkpoint", value)
        raise JobCancelled(self._gone())

    def _still_held(self) -> None:
        """``progress()`` of an atomic task: only ask whether this worker still holds the job.

        Saving the checkpoint would write the job's row inside the task's
        transaction, locking it until the body commits: the heartbeat's
        renewals would wait, and a frozen body would keep the job from the
        reclaim. A plain read locks nothing; a checkpoint would be of no use
        anyway, since a retry starts over with the body rolled back.
        """
        if self.cancel_event.is_set() or not job_is_leased(self.lease):
            self.cancel_event.set()
            object.__setattr__(self, "final_tried", True)
            raise JobCancelled(self._gone())

    async def aprogress(self, value: Any) -> None:
        await sync_to_async(self.progress, thread_sensitive=True)(value)

    def save_artifact(
        self,
        name: str,
        content: Any,
        *,
        content_type: str | None = None,
        durable: bool = False,
        expires_in: float | None = None,
    ) -> Artifact:
        """Store ``content`` (bytes, or a binary file object, streamed) as an
        artifact of this job and attempt; return its record.

        Written through ``STORAGES[DISPATCH["ARTIFACT_STORAGE"]]`` with its
        size and SHA-256, then linked to the job under ``name`` and the
        current attempt, fenced by the lease: raises ``JobCancelled`` once
        this worker no longer holds the job (the file is left unlinked, for
        the orphan sweep). ``durable`` artifacts outlive the job's purge;
        ``expires_in`` (seconds) soft-deletes the artifact then. Bad input
        (a bad name, non-bytes content, a negative expiry, an unknown
        storage alias) raises before anything is written. See docs/artifacts.md.
        """
        if self.atomic:
            raise InvalidTask(
                f"save_artifact() cannot be used in an atomic task (job {self.lease.job_id}): "
                "linking the artifact locks the job's row until the task's transaction "
                "commits, which would keep the heartbeat and the reclaim waiting. Return "
                "what the artifact needs, or enqueue a follow-up job that saves it (it "
                "exists only if this task's writes commit)."
            )
        if self.cancel_event.is_set():
            raise JobCancelled(self._gone())
        if name in self.saved_artifacts:
            raise ArtifactExists(
                f"this attempt of job {self.lease.job_id} already saved an artifact named "
                f"{name!r}; use another name"
            )
        attempt = self.task_result.attempts
        spec = LinkSpec(OwnerKind.JOB, self.lease.job_id, name, attempt)

        def finish(artifact_id: int, stored: dict[str, Any]) -> Any:
            return artifact_store.artifact_finish_job(
                self.lease,
                artifact_id,
                spec,
                stored=stored,
                supersede=name not in self.saved_artifacts,
            )

        def lost() -> JobCancelled:
            self.cancel_event.set()
            return JobCancelled(self._gone())

        artifact = artifact_files.save(
            namespace=self.lease.namespace,
            kind=OwnerKind.JOB,
            owner_id=self.lease.job_id,
            attempt_dir=f"a{attempt}",
            name=name,
            content=content,
            content_type=content_type,
            durable=durable,
            expires_in=expires_in,
            finish=finish,
            lost=lost,
        )
        self.saved_artifacts.add(name)
        return artifact

    async def asave_artifact(self, name: str, content: Any, **options: Any) -> Artifact:
        return await sync_to_async(self.save_artifact, thread_sensitive=True)(
            name, content, **options
        )

    def _gone(self) -> str:
        return (
            f"job {self.lease.job_id} was cancelled, timed out, or taken over by another "
            "worker; stop now (the result of this attempt is discarded)"
        )
