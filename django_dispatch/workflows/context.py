"""What a step function receives: the run's input, earlier outputs, a resume cursor."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from ..compat import InvalidTask
from ..conf import get_settings
from ..store import workflows as wf_store
from ..tasks.artifact_files import save_for_step
from ..tasks.values import to_json
from . import waiting
from .exceptions import InvalidMap, StepLost
from .registry import get_workflow

if TYPE_CHECKING:
    from .definition import Workflow


@dataclass(frozen=True, slots=True)
class StartChild:
    """Returned by a step to start a child run and wait for it.

    The child run is inserted in the same transaction that parks the step as
    ``waiting``; when the child succeeds, the step succeeds with the child's
    output and the parent run goes on.
    """

    workflow_name: str
    input: Any


@dataclass(frozen=True, slots=True)
class StartMap:
    """Returned by a step to start one child run per input and wait for them all.

    The children are inserted in the same transaction that parks the step as
    ``waiting``; when every one has succeeded, the step succeeds with their
    outputs in the order of ``inputs``. At most ``max_parallel`` of them
    (None: no bound) are runnable at once, across the cluster.
    """

    workflow_name: str
    inputs: list[Any]
    max_parallel: int | None


@dataclass(eq=False)
class StepContext:
    """The argument of every step function.

    ``input`` is the run's input; ``outputs`` maps the name of every step
    this one depends on, directly or not, to its output (None for a skipped
    step). ``checkpoint`` is the last value saved with ``progress()`` by this
    or an earlier attempt of the step in this generation (None at first).
    """

    run_id: int
    step: str
    input: Any
    outputs: Mapping[str, Any]
    attempt: int
    generation: int
    step_id: int
    claim_id: str
    saved_checkpoint: Any = None
    #: Set when the attempt timed out or lost its claim.
    stop_event: threading.Event = field(default_factory=threading.Event)
    #: The step job's own cancel flag (job cancelled, or its worker lost it).
    job_cancel_event: threading.Event | None = None
    child_requested: StartChild | StartMap | None = None
    #: Who or what started the run (``Workflow.start(context=...)``), or None.
    call_context: Any = None
    #: The results of this step's finished waits, in call order (see ``waiting``).
    waits: list[Any] = field(default_factory=list)
    #: Wait calls made so far by this attempt.
    wait_calls: int = 0
    #: Monotonic time the worker stops this attempt at (its timeout), if it does.
    deadline: float | None = None
    #: An ``atomic=True`` step: its body runs in the transaction that writes
    #: its outcome, so ``progress()`` saves nothing and artifacts are refused.
    atomic: bool = False

    def __post_init__(self) -> None:
        self.outputs = MappingProxyType(dict(self.outputs))

    def over_time(self) -> bool:
        """Whether the worker stopped this attempt at the step's timeout."""
        return self.deadline is not None and self.cancelled and time.monotonic() >= self.deadline

    @property
    def checkpoint(self) -> Any:
        return self.saved_checkpoint

    @property
    def cancelled(self) -> bool:
        """True once the attempt timed out, lost its step, or its job was cancelled.

        Cheap to poll (no database access). Stop then: whatever the step
        returns afterwards is discarded.
        """
        job = self.job_cancel_event
        return self.stop_event.is_set() or (job is not None and job.is_set())

    def progress(self, value: Any) -> None:
        """Persist ``value`` (JSON) as the step's resume cursor, fenced by its claim.

        Raises ``StepLost`` (a ``JobCancelled``) once this attempt no longer
        holds the step: the run was cancelled or reopened, the step skipped,
        swept, or timed out. In an ``atomic=True`` step it only checks the
        claim (a read): a checkpoint would roll back with the attempt's other
        writes, and writing the step row would hold it against the next claim.
        """
        if self.cancelled:
            raise StepLost(self._gone())
        value = to_json(value, "A step checkpoint")
        if self.atomic:
            held = wf_store.workflow_step_holds(self.step_id, self.claim_id)
        else:
            held = wf_store.workflow_step_progress(self.step_id, self.claim_id, value)
        if not held:
            self.stop_event.set()
            raise StepLost(self._gone())
        self.saved_checkpoint = value

    async def aprogress(self, value: Any) -> None:
        await sync_to_async(self.progress, thread_sensitive=True)(value)

    def save_artifact(self, name: str, content: Any, **options: Any) -> Any:
        """Store an artifact of this step and attempt (see ``context.save_artifact``
        and docs/artifacts.md); raises ``StepLost`` once the attempt lost its step."""
        if self.cancelled:
            raise StepLost(self._gone())
        if self.atomic:
            raise InvalidTask(
                f"save_artifact() cannot be used in an atomic step ({self.step!r} of run "
                f"{self.run_id}): linking it locks the step's row until the step's "
                "transaction commits (the next claim of the step would wait for a frozen "
                "attempt), and its file would outlive a rolled-back attempt. Return what it "
                "needs, and save it in a later step."
            )

        def lost() -> StepLost:
            self.stop_event.set()
            return StepLost(self._gone())

        return save_for_step(
            self.step_id, self.claim_id, self.generation, self.attempt, name, content,
            lost=lost, **options,
        )  # fmt: skip

    def start_child(self, workflow: Workflow, input: Any = None) -> StartChild:
        """Ask to start a child run of ``workflow``; *return* what this gives.

        ::

            @wf.step()
            def ship(ctx):
                return ctx.start_child(shipping, {"order": ctx.input["order"]})

        Nothing is written until the step returns it: the child run and the
        step's switch to ``waiting`` commit together, and only while this
        attempt still holds the step.
        """
        get_workflow(workflow.name)  # registered, so the worker will find it
        request = StartChild(workflow.name, to_json(input, "A child run's input"))
        self.child_requested = request
        return request

    def map(
        self, workflow: Workflow, inputs: Iterable[Any], *, max_parallel: int | None = None
    ) -> StartMap:
        """Ask to start one child run of ``workflow`` per input; *return* what this gives.

        ::

            @wf.step()
            def import_rows(ctx):
                return ctx.map(import_row, ctx.input["rows"], max_parallel=10)

        The step waits, holding no thread; its output is the list of the
        children's outputs, in the order of ``inputs`` (``[]`` for none). A
        cancelled child fails the step and parks the run. At most
        ``max_parallel`` children run at once, across all workers; the
        others are created, and wait for a slot. More inputs than
        ``DISPATCH["MAP_MAX_ITEMS"]`` raise ``InvalidMap`` (the step fails
        without retry), as does an input that is not JSON.
        """
        get_workflow(workflow.name)  # registered, so the worker will find it
        request = StartMap(workflow.name, map_inputs(inputs), map_parallelism(max_parallel))
        self.child_requested = request
        return request

    def wait_for_event(
        self, name: str, *, key: str | None = None, timeout: float | None = None
    ) -> Any:
        """Wait, durably, for an event ``name`` (with ``key``, if given); return its payload.

        No worker thread is held while the step waits: the step stops here,
        and runs again from the top when a matching event is published (or
        was, since the run started), this call then returning its payload.
        Every run waiting on the event gets its own copy. After ``timeout``
        seconds (database clock) without one, this call raises
        ``EventTimeout`` in the re-run, which the step may catch. Code above
        this call runs again on resume: see docs/workflows.md.
        """
        return waiting.wait_for_event(self, name, key=key, timeout=timeout)

    def sleep(self, seconds: float) -> None:
        """Sleep durably (database clock; survives restarts), holding no worker."""
        waiting.sleep(self, seconds)

    def sleep_until(self, when: datetime) -> None:
        """Sleep durably until ``when`` (an aware datetime), holding no worker."""
        waiting.sleep_until(self, when)

    def _gone(self) -> str:
        return (
            f"step {self.step!r} of run {self.run_id} was cancelled, reopened, skipped, swept "
            "or timed out: stop now (the result of this attempt is discarded)"
        )


def map_inputs(inputs: Iterable[Any]) -> list[Any]:
    """``ctx.map``'s inputs as a list of JSON values, or ``InvalidMap`` saying why not."""
    if isinstance(inputs, str | bytes | Mapping) or not isinstance(inputs, Iterable):
        raise InvalidMap(
            f"ctx.map() takes a list of inputs (one child run each), got "
            f"{type(inputs).__name__}: pass e.g. a list of rows or of ids."
        )
    most = get_settings().MAP_MAX_ITEMS
    items = list(islice(inputs, most + 1))  # a longer (or endless) iterable is not read on
    if len(items) > most:
        raise InvalidMap(
            f"ctx.map() got more than {most:,} inputs; DISPATCH['MAP_MAX_ITEMS'] allows at most "
            f"{most:,}. Map over chunks (each child handles a slice), or raise the setting."
        )
    try:
        return [to_json(item, f"Input {i} of ctx.map()") for i, item in enumerate(items)]
    except (InvalidTask, TypeError, ValueError) as e:
        raise InvalidMap(str(e)) from e


def map_parallelism(max_parallel: Any) -> int | None:
    if max_parallel is None:
        return None
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise InvalidMap(
            f"ctx.map(): max_parallel must be a whole number of at least 1, or None for no "
            f"bound; got {max_parallel!r}."
        )
    return max_parallel
