"""Durable waits inside a step: ``ctx.wait_for_event``, ``ctx.sleep``, ``ctx.sleep_until``.

How a step resumes (chosen over a step returning a wait marker, see
docs/workflows.md): the first time a step reaches a wait it has no result
for, the call raises ``WaitRequested`` (a ``BaseException``, so a step's
``except Exception`` does not swallow it); the engine records the wait and
the attempt ends, freeing the worker thread. When the wait ends the step
runs again *from the top*, and its n-th wait call returns the n-th recorded
result at once (waits are numbered by call order within the step, like
DBOS's function ids). So code before a wait runs again on every resume:
keep side effects in an earlier step, make them idempotent, or guard them
with ``ctx.checkpoint`` / ``ctx.progress()``.

These calls touch no database: they are as cheap in an async step as in a
sync one.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..services.events import check_key, check_name, check_timeout
from ..store.workflows import WaitSpec
from .exceptions import EventTimeout, WorkflowDefinitionError

if TYPE_CHECKING:
    from .context import StepContext


class WaitRequested(BaseException):
    """Raised by a wait call with no recorded result: the engine records ``spec``."""

    def __init__(self, spec: WaitSpec) -> None:
        super().__init__(f"step waits: {spec}")
        self.spec = spec


def _recorded(ctx: StepContext, kind: str, what: str) -> dict[str, Any] | None:
    """The result recorded for this wait call (the next in call order), or None."""
    index = ctx.wait_calls
    ctx.wait_calls += 1
    if index >= len(ctx.waits):
        return None
    entry = ctx.waits[index]
    if entry.get("kind") != kind:
        raise WorkflowDefinitionError(
            f"step {ctx.step!r}: wait call #{index + 1} is now {what}, but the wait recorded "
            f"for it was a {entry.get('kind')}; a step must make its waits in the same order "
            "on every run (replay the step from the admin to start its waits over)."
        )
    return entry


def wait_for_event(
    ctx: StepContext, name: str, *, key: str | None = None, timeout: float | None = None
) -> Any:
    """See ``StepContext.wait_for_event``."""
    check_name(name)
    check_key(key)
    seconds = None if timeout is None else check_timeout(timeout)
    entry = _recorded(ctx, "event", f"a wait for event {name!r}")
    if entry is None:
        raise WaitRequested(WaitSpec("event", name=name, key=key, seconds=seconds))
    if entry.get("timed_out"):
        keyed = f" with key {key!r}" if key is not None else ""
        raise EventTimeout(
            f"step {ctx.step!r} of run {ctx.run_id}: no event {name!r}{keyed} was published "
            f"within {timeout} s"
        )
    return entry.get("payload")


def sleep(ctx: StepContext, seconds: float) -> None:
    """See ``StepContext.sleep``."""
    seconds = check_timeout(seconds, "sleep seconds")
    if _recorded(ctx, "sleep", "a sleep") is None:
        raise WaitRequested(WaitSpec("sleep", seconds=seconds))


def sleep_until(ctx: StepContext, when: datetime) -> None:
    """See ``StepContext.sleep_until``."""
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise ValueError(
            f"sleep_until needs an aware datetime (e.g. django.utils.timezone.now() + "
            f"timedelta(days=3)), got {when!r}."
        )
    if _recorded(ctx, "sleep", "a sleep") is None:
        raise WaitRequested(WaitSpec("sleep", until=when))
