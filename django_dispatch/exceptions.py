"""Exceptions raised to users of django_dispatch.

Every message says what was wrong and what to do about it.
"""

from .compat import InvalidTask


class DispatchError(Exception):
    """Base class of django_dispatch's own errors."""


class ActionNotAllowed(DispatchError):
    """An operator action on a workflow does not fit the run's or step's
    current state (raised by the store, under the run's lock: nothing written)."""


class JobCancelled(DispatchError):
    """The job was cancelled, or this worker no longer holds its lease.

    Raised by ``context.progress()`` so that a task stops cooperatively; the
    worker then discards whatever the task returns.
    """


class TaskTimeout(DispatchError, TimeoutError):
    """An attempt ran longer than its task's ``timeout``."""


class WorkerLost(DispatchError):
    """The job's worker died while running it (SIGKILL, OOM, power loss)."""


class AlreadyReplayed(DispatchError):
    """Another replay of this dead letter already won."""


class UnknownTask(DispatchError):
    """A job names a task path that no longer imports to a registered Task."""


class InvalidTaskArguments(InvalidTask, TypeError):
    """Arguments given at enqueue cannot be stored as JSON, or do not fit the task.

    An ``InvalidTask`` and a ``TypeError``: Django's own backends raise
    ``TypeError`` for arguments that are not JSON, so code written for them
    catches what we raise.
    """


class InvalidTaskArgumentValue(InvalidTaskArguments, ValueError):
    """An argument of a JSON type whose value cannot be stored as JSON.

    Bytes that are not UTF-8 text, NaN or infinity, a NUL character or an
    unpaired surrogate. Also a ``ValueError``: Django's ``normalize_json``
    raises ``ValueError`` for bytes that are not UTF-8, so code written for
    Django's own backends catches what we raise (and it stays an
    ``InvalidTaskArguments``, a ``TypeError``, like every argument error).
    """


class ArtifactExists(DispatchError):
    """A live artifact already holds these storage coordinates (storage alias and
    stored name), or the owner already linked another artifact under this name
    in this attempt. Exactly one of two concurrent creates gets it."""
