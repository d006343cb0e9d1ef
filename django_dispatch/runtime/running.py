"""What a worker process tracks about one claimed job, from its claim to its written outcome."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from ..compat import Task
from ..exceptions import UnknownTask
from ..store import ClaimedJob
from .executor import Outcome

#: Serialises the making of a job's cancel event (``RunningJob.cancel_event``).
_EVENT_MADE = threading.Lock()


class RunningJob:
    """A job this process holds, shared by the control loop, its thread and the completer.

    A plain class whose defaults are class attributes: one is made per claimed
    job on the control loop, where an ``__init__`` assigning each of twenty
    fields is a measurable share of a short job's CPU. ``fields`` sets any
    of the annotated attributes below at once.
    """

    #: The Task its row names, resolved once per job (``attempt.resolve``, on
    #: the job thread, before its clock starts) for the attempt and the
    #: timeouts; None until then, or when it cannot be resolved (``unknown``
    #: says why).
    task: Task | None = None
    unknown: UnknownTask | None = None
    deadline: float | None = None  # monotonic; None: no timeout or not started
    #: When a job thread picked it up (monotonic); None while it waits, claimed ahead.
    begun_at: float | None = None
    #: Asked to stop (``stop``): a plain flag. The ``threading.Event`` a task's
    #: context reads is made only when something asks for it
    #: (``cancel_event``): an Event per job (a Condition and a Lock) is a
    #: measurable share of a no-op job's CPU, and most jobs never need one.
    stop_asked: bool = False
    _cancel_event: threading.Event | None = None
    abandoned: bool = False  # timed out or handed back: its result is dropped
    # Batched completion: the outcome waiting for the control loop's write,
    # then whether that write won (None: it failed, write it one by one).
    finished: Outcome | None = None
    #: Set (by the control loop) once that write is over. A plain flag, not
    #: an Event: nothing blocks on it, and an Event per job (a Condition and
    #: a Lock) is a measurable share of a no-op job's CPU.
    persisted: bool = False
    won: bool | None = False
    #: Called (from the control loop) once ``persisted`` is set: how the
    #: asyncio executor learns it without a thread waiting.
    on_persisted: Callable[[], None] | None = None
    #: Runs on this process's event loop (``asyncjobs``), not a job thread.
    on_loop: bool = False
    #: The attempt's meter (``metering.Meter``) while its success waits for
    #: the wave that writes its usage record, its thread gone on to another job.
    meter: Any = None
    #: Taken by a completion wave (``BatchCompleter.take``), or withdrawn from
    #: the waves to be written one by one (``BatchCompleter.withdraw``).
    in_wave: bool = False
    withdrawn: bool = False
    #: Its success joined its thread's group of atomic jobs (``atomic_group``),
    #: to be written with the group's commit; set once, under the group's lock.
    grouped: bool = False
    _loop: asyncio.AbstractEventLoop | None = None
    _atask: asyncio.Task[Any] | None = None

    def __init__(self, claimed: ClaimedJob, lease_seconds: float, **fields: Any) -> None:
        self.claimed = claimed
        self.lease_seconds = lease_seconds
        for name, value in fields.items():
            if name not in _FIELDS:  # a method's name too: ``stop=`` must not replace it
                raise TypeError(f"RunningJob has no field {name!r}")
            setattr(self, name, value)

    @property
    def awaits_wave(self) -> bool:
        """A success queued for a completion wave that no wave has taken yet
        (nor the watchdog withdrawn): it holds its slot (``Slots.free``)."""
        return (
            self.finished is not None
            and self.on_persisted is not None
            and not (self.in_wave or self.withdrawn or self.persisted)
        )

    def mark_persisted(self) -> None:
        """On the control loop, once the wave that held this success is written
        or failed: ``persisted`` set, then ``on_persisted`` called once.

        The callback (a partial holding this job) is dropped before it runs:
        job -> callback -> job was each job's one reference cycle, which left
        the job, its row and its outcome to the cyclic GC.
        """
        self.persisted = True
        callback, self.on_persisted = self.on_persisted, None
        if callback is not None:
            callback()

    @property
    def cancel_event(self) -> threading.Event:
        """The job's stop event, shared with its task's context, made on first use
        and set at once if the job was asked to stop before.

        The event is published before the flag is read, and ``stop`` sets the
        flag before it reads the event: whichever comes second sees the
        other's write, so a stop is never lost between the two.
        """
        event = self._cancel_event
        if event is None:
            with _EVENT_MADE:
                event = self._cancel_event
                if event is None:
                    event = self._cancel_event = threading.Event()
                    if self.stop_asked:
                        event.set()
        return event

    @property
    def stop_requested(self) -> bool:
        """Whether the job was asked to stop: by ``stop``, or through its event
        (a task's context sets it when the lease is lost)."""
        if self.stop_asked:
            return True
        event = self._cancel_event
        return event is not None and event.is_set()

    def stop(self) -> None:
        """Ask the job to stop: flag for sync tasks, cancellation for async ones."""
        self.stop_asked = True
        event = self._cancel_event
        if event is not None:
            event.set()
        loop, atask = self._loop, self._atask
        if loop is not None and atask is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(atask.cancel)


#: What ``RunningJob(**fields)`` may set: its annotated fields.
_FIELDS = frozenset(RunningJob.__annotations__)
