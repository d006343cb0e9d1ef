"""Workflow definitions: a name and an ordered list of validated steps.

Pure Python, no database: importing a module that defines workflows works
before Django's app registry is ready. Everything that can be checked is
checked when the module is imported (duplicate names, unknown, later or
cyclic dependencies, functions that a worker could not import by path, bad
options), so a broken definition fails at deploy time, not at 03:00.

Workflows register themselves by name on import (see ``registry``, where a
worker looks a step row's code up).
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings

from ..compat import (
    DEFAULT_TASK_BACKEND_ALIAS,
    DEFAULT_TASK_QUEUE_NAME,
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
)
from .backoff import BACKOFF_CAP_SECONDS, BackoffFunction, backoff_delay, default_backoff
from .exceptions import UnknownWorkflow, WorkflowDefinitionError
from .registry import get_workflow, register, resolve_step

if TYPE_CHECKING:
    from ..models import WorkflowRun

__all__ = [
    "BACKOFF_CAP_SECONDS",
    "BackoffFunction",
    "StepDef",
    "Workflow",
    "backoff_delay",
    "check_graph",
    "default_backoff",
    "get_workflow",
    "resolve_step",
]

F = TypeVar("F", bound=Callable[..., Any])

NAME_MAX_LENGTH = 200
PATH_MAX_LENGTH = 255
QUEUE_MAX_LENGTH = 100


@dataclass(frozen=True, slots=True)
class StepDef:
    """One step of a workflow as defined in code."""

    name: str
    func: Callable[..., Any]
    handler_path: str
    sequence: int
    depends_on: tuple[str, ...]
    max_attempts: int
    #: Seconds (a number), the import path of a BackoffFunction, or None
    #: (exponential: about 1 s, 2 s, 4 s, ... capped at an hour).
    backoff: float | str | None
    timeout: float | None
    #: Where the step's jobs go; None: the run's queue, the default priority.
    queue_name: str | None = None
    priority: int | None = None
    #: The step's writes to the jobs' database, its outcome and the run's
    #: advance commit in one transaction, under its claim (``workflows.atomic``).
    atomic: bool = False


def _path_of(func: Callable[..., Any], what: str) -> str:
    """The import path a worker will use, or an error if it cannot import it."""
    qualname = getattr(func, "__qualname__", "")
    module = getattr(func, "__module__", None)
    if not inspect.isfunction(func) or not module or not qualname:
        raise WorkflowDefinitionError(f"{what} must be a plain function, got {func!r}.")
    if "<" in qualname or "." in qualname:
        raise WorkflowDefinitionError(
            f"{what} {module}.{qualname} must be defined at module level (not a lambda, "
            "a nested function or a method): workers import it by its path."
        )
    if module == "__main__":
        raise WorkflowDefinitionError(
            f"{what} {qualname} is defined in __main__, which a worker cannot import: "
            "define it in a module of your project."
        )
    path = f"{module}.{qualname}"
    if len(path) > PATH_MAX_LENGTH:
        raise WorkflowDefinitionError(f"{what} path {path!r} is longer than {PATH_MAX_LENGTH}.")
    return path


def _check_options(name: str, max_attempts: Any, backoff: Any, timeout: Any) -> float | str | None:
    """Validate per-step options; return the backoff as stored (number or path)."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise WorkflowDefinitionError(
            f"step {name!r}: max_attempts must be a whole number of at least 1, "
            f"got {max_attempts!r}."
        )
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        raise WorkflowDefinitionError(
            f"step {name!r}: timeout must be a positive number of seconds, got {timeout!r}."
        )
    if backoff is None:
        return None
    if isinstance(backoff, int | float) and not isinstance(backoff, bool):
        if not (math.isfinite(backoff) and backoff >= 0):
            raise WorkflowDefinitionError(
                f"step {name!r}: backoff must be seconds >= 0, got {backoff!r}."
            )
        return float(backoff)
    if callable(backoff):
        return _path_of(backoff, f"step {name!r}: backoff function")
    raise WorkflowDefinitionError(
        f"step {name!r}: backoff must be seconds (a number) or a module-level function "
        f"attempt -> seconds, got {backoff!r}."
    )


def _check_route(name: str, queue_name: Any, priority: Any) -> None:
    """A step's queue and priority, checked as Django checks a task's.

    Whether ``TASKS["default"]["QUEUES"]`` allows the queue is not checked
    here: an exception at import would take down ``check`` and
    ``runserver`` with a traceback instead of a message. The system check
    ``django_dispatch.E006`` reports it (``checks.workflows``), and building
    the step's job refuses it, as any enqueue refuses an unlisted queue.
    """
    if queue_name is not None and (
        not isinstance(queue_name, str) or not queue_name or len(queue_name) > QUEUE_MAX_LENGTH
    ):
        raise WorkflowDefinitionError(
            f"step {name!r}: queue_name must be a non-empty string of at most "
            f"{QUEUE_MAX_LENGTH} characters, got {queue_name!r}."
        )
    if priority is not None and (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY
    ):
        raise WorkflowDefinitionError(
            f"step {name!r}: priority must be a whole number from {TASK_MIN_PRIORITY} to "
            f"{TASK_MAX_PRIORITY} (higher runs first), got {priority!r}."
        )


def _check_atomic(name: str, path: str, func: Callable[..., Any], atomic: Any) -> None:
    """``atomic`` is a bool, and only for a sync function.

    An async step's ORM calls run on other threads than the one holding
    the transaction (``sync_to_async``), so its writes could not commit
    with its outcome: refused, as ``@task(atomic=True)`` refuses async tasks.
    """
    if not isinstance(atomic, bool):
        raise WorkflowDefinitionError(
            f"step {name!r}: atomic must be True or False, got {atomic!r}."
        )
    if atomic and inspect.iscoroutinefunction(func):
        raise WorkflowDefinitionError(
            f"step {name!r}: {path} is an async def with atomic=True: atomic steps must be "
            "plain (sync) functions, whose writes run on the thread holding the step's "
            "transaction. Make it a def, or drop atomic=True."
        )


def allowed_queues() -> set[str]:
    """The queue names the default task backend allows (empty: any)."""
    if not settings.configured:
        return set()
    backends = getattr(settings, "TASKS", None) or {}
    default = backends.get(DEFAULT_TASK_BACKEND_ALIAS) or {}
    return set(default.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME]))


def check_graph(steps: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Validate (name, dependencies) pairs in definition order.

    Names must be unique and every dependency must name an *earlier* step,
    which also rules out cycles; each problem gets its own clear message.
    """
    seen: set[str] = set()
    names = [name for name, _ in steps]
    for name, deps in steps:
        if name in seen:
            raise WorkflowDefinitionError(f"duplicate step name {name!r}.")
        for dep in deps:
            if dep == name:
                raise WorkflowDefinitionError(f"step {name!r} cannot depend on itself.")
            if dep not in names:
                raise WorkflowDefinitionError(
                    f"step {name!r} depends on unknown step {dep!r} (known: {sorted(names)})."
                )
            if dep not in seen:
                raise WorkflowDefinitionError(
                    f"step {name!r} depends on {dep!r}, which is defined after it: this is a "
                    f"cycle or an order mistake. Define {dep!r} above {name!r}."
                )
        if len(set(deps)) != len(deps):
            raise WorkflowDefinitionError(f"step {name!r} lists a dependency twice: {list(deps)}.")
        seen.add(name)


class Workflow:
    """A named, ordered list of steps; runs are started with ``start()``.

    ::

        checkout = Workflow("checkout")

        @checkout.step()
        def reserve(ctx): ...

        @checkout.step(max_attempts=5, backoff=2)
        def charge(ctx): ...          # after "reserve" (the previous step)

        @checkout.step(after=["reserve"], timeout=30)
        def notify(ctx): ...          # runs in parallel with "charge"

        run = checkout.start({"order": 7}, idempotency_key="order-7")

    A step without ``after`` depends on the step defined just before it
    (none for the first); ``after=[]`` makes it start with the run.
    """

    def __init__(self, name: str, *, queue_name: str = "default") -> None:
        if not isinstance(name, str) or not name or len(name) > NAME_MAX_LENGTH:
            raise WorkflowDefinitionError(
                f"a workflow name must be a non-empty string of at most {NAME_MAX_LENGTH} "
                f"characters, got {name!r}."
            )
        self.name = name
        self.queue_name = queue_name
        self.module = sys._getframe(1).f_globals.get("__name__", "")
        self._steps: list[StepDef] = []
        register(self)

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r}: {[s.name for s in self._steps]}>"

    @property
    def steps(self) -> tuple[StepDef, ...]:
        return tuple(self._steps)

    def get_step(self, name: str) -> StepDef:
        for step in self._steps:
            if step.name == name:
                return step
        raise UnknownWorkflow(f"workflow {self.name!r} has no step {name!r}.")

    def step(
        self,
        *,
        name: str | None = None,
        after: Iterable[str | Callable[..., Any]] | None = None,
        max_attempts: int = 1,
        backoff: float | BackoffFunction | None = None,
        timeout: float | None = None,
        queue_name: str | None = None,
        priority: int | None = None,
        atomic: bool = False,
    ) -> Callable[[F], F]:
        """Register the decorated function as the next step; return it unchanged.

        The function takes one argument, a ``StepContext``, and returns JSON
        (or ``ctx.start_child(...)``). ``after`` names earlier steps (or
        passes their functions); ``max_attempts`` counts failed attempts
        before the run is parked as stuck; ``backoff`` is seconds, or a
        module-level ``fn(attempt) -> seconds``; ``timeout`` is seconds per
        attempt. ``queue_name`` and ``priority`` route the step's jobs (by
        default: the workflow's queue, the default priority), e.g. a heavy
        step to the workers started with ``rundispatch --queues heavy``.
        ``atomic=True`` commits the step's writes to the jobs' database with
        its output and the run's advance, or not at all (a sync function only).
        """

        def register(func: F) -> F:
            self.add_step(
                func,
                name=name,
                after=after,
                max_attempts=max_attempts,
                backoff=backoff,
                timeout=timeout,
                queue_name=queue_name,
                priority=priority,
                atomic=atomic,
            )
            return func

        return register

    def add_step(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        after: Iterable[str | Callable[..., Any]] | None = None,
        max_attempts: int = 1,
        backoff: float | BackoffFunction | None = None,
        timeout: float | None = None,
        queue_name: str | None = None,
        priority: int | None = None,
        atomic: bool = False,
    ) -> StepDef:
        """``step()`` without the decorator syntax."""
        handler_path = _path_of(func, "a step function")
        step_name = name or func.__name__
        if not isinstance(step_name, str) or len(step_name) > NAME_MAX_LENGTH:
            raise WorkflowDefinitionError(f"invalid step name {step_name!r}.")
        try:
            inspect.signature(func).bind(None)
        except TypeError:
            raise WorkflowDefinitionError(
                f"step {step_name!r}: {handler_path} must take exactly one argument, the "
                "step context (def step(ctx): ...)."
            ) from None
        stored_backoff = _check_options(step_name, max_attempts, backoff, timeout)
        _check_route(step_name, queue_name, priority)
        _check_atomic(step_name, handler_path, func, atomic)
        deps = self._dependencies(step_name, after)
        check_graph([(s.name, s.depends_on) for s in self._steps] + [(step_name, deps)])
        step = StepDef(
            name=step_name,
            func=func,
            handler_path=handler_path,
            sequence=len(self._steps),
            depends_on=deps,
            max_attempts=max_attempts,
            backoff=stored_backoff,
            timeout=None if timeout is None else float(timeout),
            queue_name=queue_name,
            priority=priority,
            atomic=atomic,
        )
        self._steps.append(step)
        return step

    def _dependencies(
        self, name: str, after: Iterable[str | Callable[..., Any]] | None
    ) -> tuple[str, ...]:
        if after is None:
            return (self._steps[-1].name,) if self._steps else ()
        if isinstance(after, str):
            raise WorkflowDefinitionError(
                f"step {name!r}: after= takes a list of step names, e.g. after=[{after!r}]."
            )
        deps = []
        for dep in after:
            if isinstance(dep, str):
                deps.append(dep)
                continue
            matches = [s.name for s in self._steps if s.func is dep]
            if len(matches) != 1:
                raise WorkflowDefinitionError(
                    f"step {name!r}: after= lists {dep!r}, which is not a step of {self.name!r}."
                )
            deps.append(matches[0])
        return tuple(deps)

    def start(
        self,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        backend: str = "default",
        context: Any = None,
    ) -> WorkflowRun:
        """Start a run: insert it and all its steps, enqueue the first steps' jobs.

        One transaction, inside the caller's when there is one: the run
        exists exactly when the surrounding data does. With an
        ``idempotency_key``, a second start (even a concurrent one) returns
        the run the first one created instead of starting another.
        ``backend`` is the TASKS alias whose namespace the run, its steps and
        their jobs live in (idempotency keys are unique per namespace).
        ``context`` (JSON) says who or what started the run (request id,
        user id, trace id...): stored on the run, shown in the admin,
        ``ctx.call_context`` in every step, and copied to child runs.
        """
        # Imported here, not at the top: the engine needs Django's models, and a
        # module defining workflows must import before the app registry is ready.
        from .engine import start_run

        return start_run(
            self, input, idempotency_key=idempotency_key, backend=backend, context=context
        )
