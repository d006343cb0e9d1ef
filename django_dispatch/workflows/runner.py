"""Run one attempt of a step function and classify what happened. No state writes.

Outcomes: ``succeeded`` (a JSON output), ``child`` (the step returned
``ctx.start_child(...)``), ``map`` (it returned ``ctx.map(...)``), ``wait``
(it reached a durable wait with no result yet: ``waiting``), ``failed`` (an
exception; ``retryable`` says whether another attempt could help), or
``lost`` (the attempt was stopped: timed out, cancelled or its claim lost, so
whatever it produced must not be written). Persisting the outcome is the engine's job.

Timeouts: an ``async def`` step runs under ``asyncio.timeout``. A sync step
with a timeout, under ``rundispatch``, runs on the job's own thread with the
step's timeout set on its job (``runtime.timeouts.limit_this_job``): asked to
stop at the deadline, and ended by recycling the process if it has not
returned a grace period later, as a task is. Where the process cannot be
recycled (``drain()``), it runs on a helper thread the step job waits for at
most ``timeout`` seconds; a thread cannot be killed, so the attempt is
failed at once, ``ctx.cancelled`` turns True, and its late writes to the step
are rejected by the claim fence. Without a timeout, a sync step runs on the
job's own thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from inspect import iscoroutinefunction
from typing import Any, Literal

from asgiref.sync import async_to_sync
from django.db import connections

from ..compat import InvalidTask
from ..exceptions import JobCancelled
from ..runtime.timeouts import limit_this_job
from ..store import carrying_database
from ..tasks.results import error_of as job_error_of
from ..tasks.values import to_json
from .context import StartChild, StartMap, StepContext
from .exceptions import InvalidMap, StepTimeout
from .waiting import WaitRequested

Kind = Literal["succeeded", "child", "map", "wait", "failed", "lost"]


@dataclass
class StepOutcome:
    """What one attempt of a step came to (a job's outcome is ``runtime.executor``'s)."""

    kind: Kind
    value: Any = None
    exception: BaseException | None = None
    retryable: bool = True
    #: False: a cause no retry can fix, found before the step's code could
    #: be blamed (not defined any more, output not JSON): the run parks
    #: without the attempt being counted.
    counted: bool = True
    #: Set when the outcome was already written, with the attempt's own
    #: writes, in one transaction (an atomic step): True if its claim held
    #: (committed), False if not (rolled back). None: not written yet.
    recorded: bool | None = None


def error_of(exception: BaseException, attempt: int) -> dict[str, Any]:
    """One failed attempt as stored in a step's ``errors``: a job error entry plus its number."""
    return {**job_error_of(exception), "attempt": attempt}


def run_attempt(
    func: Callable[[StepContext], Any], ctx: StepContext, timeout: float | None
) -> StepOutcome:
    """Call the step function once and classify the result."""
    try:
        if iscoroutinefunction(func):
            value = async_to_sync(_call_async)(func, ctx, timeout)
        elif timeout is not None:
            value = _call_limited(func, ctx, timeout)
        else:
            value = func(ctx)
    except WaitRequested as wait:  # a durable wait with no result yet: record it
        if ctx.cancelled:
            return StepOutcome(kind="lost")
        return StepOutcome(kind="wait", value=wait.spec)
    except StepTimeout as e:
        ctx.stop_event.set()
        return StepOutcome(kind="failed", exception=e)
    except InvalidMap as e:  # the same inputs would be refused again
        return StepOutcome(kind="failed", exception=e, retryable=False)
    except (JobCancelled, asyncio.CancelledError) as e:
        if ctx.over_time():  # asked to stop by the worker at the step's timeout
            return StepOutcome(kind="failed", exception=_overran(ctx, timeout))
        if ctx.cancelled:  # stopped on purpose: discard
            return StepOutcome(kind="lost", exception=e)
        return StepOutcome(kind="failed", exception=e)  # raised by the step itself
    except BaseException as e:  # SystemExit from a step fails the attempt, not the worker
        return StepOutcome(kind="failed", exception=e)
    if isinstance(value, StepOutcome):  # classified (and written) by an atomic step's body
        return value
    return classify(value, ctx, timeout)


def classify(value: Any, ctx: StepContext, timeout: float | None) -> StepOutcome:
    """What a step function's return value comes to (it returned, raised nothing)."""
    if ctx.over_time():
        return StepOutcome(kind="failed", exception=_overran(ctx, timeout))
    if ctx.cancelled:
        return StepOutcome(kind="lost")
    if isinstance(value, StartChild):
        return StepOutcome(kind="child", value=value)
    if isinstance(value, StartMap):
        return StepOutcome(kind="map", value=value)
    if ctx.child_requested is not None:
        call = "map" if isinstance(ctx.child_requested, StartMap) else "start_child"
        return StepOutcome(
            kind="failed",
            retryable=False,
            exception=InvalidTask(
                f"step {ctx.step!r} called ctx.{call}() but did not return its result; "
                f"write `return ctx.{call}(...)`."
            ),
        )
    try:
        return StepOutcome(
            kind="succeeded", value=to_json(value, f"The output of step {ctx.step!r}")
        )
    except InvalidTask as e:  # the same code would return the same value again
        return StepOutcome(kind="failed", exception=e, retryable=False, counted=False)


async def _call_async(
    func: Callable[[StepContext], Any], ctx: StepContext, timeout: float | None
) -> Any:
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await func(ctx)
    except TimeoutError as e:
        if deadline.expired():
            raise StepTimeout(
                f"step {ctx.step!r} ran longer than its timeout of {timeout} s"
            ) from e
        raise


def _call_limited(func: Callable[[StepContext], Any], ctx: StepContext, timeout: float) -> Any:
    """A sync step with a timeout. In ``rundispatch``, on the job's own thread under
    the worker's timeout (``limit_this_job``): past it the step is asked to stop,
    and stuck code is ended by recycling the process, as for a task. Elsewhere
    (``drain()``, no process to recycle), on a helper thread that is abandoned."""
    if not limit_this_job(timeout):
        return _call_on_thread(func, ctx, timeout)
    ctx.deadline = time.monotonic() + timeout
    return func(ctx)


def _overran(ctx: StepContext, timeout: float | None) -> StepTimeout:
    ctx.stop_event.set()
    return StepTimeout(
        f"step {ctx.step!r} ran longer than its timeout of {timeout} s; it was asked to stop, "
        "and did"
    )


def _call_on_thread(func: Callable[[StepContext], Any], ctx: StepContext, timeout: float) -> Any:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = func(ctx)
        except BaseException as e:
            box["error"] = e
        finally:
            connections.close_all()  # this thread's connections only

    thread = threading.Thread(
        target=carrying_database(target), name=f"dispatch-step-{ctx.step_id}", daemon=True
    )
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise StepTimeout(
            f"step {ctx.step!r} ran longer than its timeout of {timeout} s; the attempt was "
            "abandoned (its thread may still be running, but can no longer write to the step)"
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")
