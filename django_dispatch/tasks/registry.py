"""Our backends, found by alias: their options, their validation, their plans.

``DispatchBackendBase`` is the part of our backend that the layers below
the ``django.tasks`` adapter use: its options (``MAX_ATTEMPTS``,
``BACKOFF``, ``NAMESPACE``), its validation, and the enqueue plans it keeps
per task. The runtime, the services and the workflows reach a backend
through ``task.get_backend()`` or ``backend_for(alias)`` and call it as one
of these; only Django instantiates its subclass, ``backend.DispatchBackend``,
which adds what Django calls (``enqueue``, ``get_result``, system checks).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ..compat import BaseTaskBackend, InvalidTask, Task, task_backends
from ..conf import generation
from ..core.retry import Backoff, exponential_backoff
from ..models import Job
from ..store.routing import alias_database
from ..store.types import JobSpec
from .options import concurrency_columns
from .placement import is_auto, place
from .plan import EnqueuePlan, no_retry_when_too_large
from .task import plain_arity, validate_options

#: Tasks whose plan one backend keeps; past that the cache starts over (tasks
#: made per call with ``using(partition_key=...)`` must not grow it forever).
PLAN_CACHE_SIZE = 512


class DispatchBackendBase(BaseTaskBackend):
    """A backend's options, validation and enqueue plans (see the module docstring).

    ``__init__`` touches no model and no database: Django builds backends
    lazily, per thread, and may do so before migrations have run.
    """

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.default_max_attempts = self.options.get("MAX_ATTEMPTS", 1)
        #: Every row this backend writes carries it (validated by a system
        #: check, see ``checks.namespace_problem``); ``""``: the default namespace.
        self.namespace: str = self.options.get("NAMESPACE", "")
        backoff = self.options.get("BACKOFF", exponential_backoff)
        self._backoff_setting = backoff
        self._plans: dict[Task, EnqueuePlan] = {}
        #: The ``DISPATCH`` generation the plans were made under: a plan's
        #: validation (``options.check_queue_of``) depends on ``DISPATCH["QUEUES"]``.
        self._plans_generation = generation("DISPATCH")

    @property
    def default_backoff(self) -> Backoff:
        backoff = self._backoff_setting
        return import_string(backoff) if isinstance(backoff, str) else backoff

    def validate_task(self, task: Task) -> None:
        """Django's rules, then ours. Runs at definition and again at enqueue.

        A queue that ``QUEUES`` does not list is not refused here: this runs
        when the module defining the task is imported, and an exception there
        would take down ``check`` and ``runserver`` with a traceback instead
        of reporting the mistake. Such a task is remembered for the
        backend's system check (E005) and refused at enqueue, by
        ``enqueue_plan``, with a message naming the task, the backend and the
        queues it accepts.
        """
        if self.queues and task.queue_name not in self.queues:
            _UNLISTED_QUEUES[(self.alias, task.module_path)] = task.queue_name
            listed = _InListedQueue(task, next(iter(self.queues)))
            super().validate_task(cast(Task, listed))
        else:
            _UNLISTED_QUEUES.pop((self.alias, task.module_path), None)  # redefined since
            super().validate_task(task)
        validate_options(task)

    def queue_problem(self, task_path: str, queue_name: str) -> str | None:
        """Why ``queue_name`` is refused for ``task_path`` on this backend; None if it is not."""
        if not self.queues or queue_name in self.queues:
            return None
        return (
            f"Task {task_path} uses queue {queue_name!r}, which TASKS[{self.alias!r}]['QUEUES'] "
            f"does not list (it accepts {sorted(self.queues)}). Add {queue_name!r} to "
            f"TASKS[{self.alias!r}]['QUEUES'] (an empty list accepts any queue), or give the "
            "task one of those queues."
        )

    def unlisted_queues(self) -> list[str]:
        """``queue_problem`` for each task defined on this backend with a queue it refuses."""
        problems = (
            self.queue_problem(path, queue)
            for (alias, path), queue in sorted(_UNLISTED_QUEUES.items())
            if alias == self.alias
        )
        return [problem for problem in problems if problem is not None]

    def max_attempts_for(self, task: Task) -> int:
        return getattr(task, "max_attempts", None) or self.default_max_attempts

    def backoff_for(self, task: Task) -> Backoff:
        """The task's backoff (or the default), never retrying a value over a size limit."""
        return functools.partial(
            no_retry_when_too_large, getattr(task, "backoff", None) or self.default_backoff
        )

    def enqueue_plan(self, task: Task) -> EnqueuePlan:
        """Validate ``task`` for enqueueing and work out what its enqueues share.

        ``validate_task`` runs at definition and, through this, again at
        enqueue. Its verdict and the job columns the task determines depend
        only on the task's fields and this backend's configuration (Django
        builds a new backend when ``TASKS`` changes), so they are kept per
        task, equal tasks sharing one entry. Not for a task with ``run_after``:
        whether that is valid also depends on ``USE_TZ``, and such tasks are
        usually made for one enqueue.
        """
        cacheable = task.run_after is None
        if self._plans_generation != generation("DISPATCH"):
            self._plans.clear()
            self._plans_generation = generation("DISPATCH")
        if cacheable:
            try:
                return self._plans[task]
            except KeyError:
                pass
            except TypeError:  # an unhashable option: validate_task says what is wrong
                cacheable = False
        if not apps.is_installed("django_dispatch"):  # its tables and worker are missing
            raise ImproperlyConfigured(
                f"TASKS[{self.alias!r}] uses DispatchBackend but 'django_dispatch' is not in "
                "INSTALLED_APPS: add it there and run `python manage.py migrate`. Nothing was "
                "enqueued."
            )
        problem = self.queue_problem(task.module_path, task.queue_name)
        if problem is not None:
            raise InvalidTask(problem)
        self.validate_task(task)
        cacheable = cacheable and not is_auto(task)  # its needs follow its history
        if getattr(task, "call_context", None) is not None:
            # The plan is shared by every call of the task: it keeps no call's context.
            task = replace(task, call_context=None)  # type: ignore[call-arg]
        plan = EnqueuePlan(
            task=task,
            spec=place(
                JobSpec.of(
                    task_path=task.module_path,
                    namespace=self.namespace,
                    backend=self.alias,
                    queue_name=task.queue_name,
                    priority=task.priority,
                    deferred_until=task.run_after,
                    partition_key=getattr(task, "partition_key", None),
                    idempotency_key=getattr(task, "idempotency_key", None),
                    **concurrency_columns(task),
                    max_attempts=self.max_attempts_for(task),
                ),
                task,
            ),
            arity=plain_arity(task),
        )
        if cacheable:
            if len(self._plans) >= PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[task] = plan
        return plan

    def build_job(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Job:
        """Validate one call and turn it into an unsaved Job. Writes nothing."""
        plan = self.enqueue_plan(task)
        json_args, json_kwargs, _, _ = plan.encode_call(args, kwargs)
        return plan.spec.new_job(json_args, json_kwargs)


class _InListedQueue:
    """A task seen through Django's ``validate_task`` as if its queue were listed,
    so that every other rule of Django's still applies at definition."""

    def __init__(self, task: Task, queue_name: str) -> None:
        self._task = task
        self.queue_name = queue_name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)


#: (alias, task path) -> the queue a task was defined with that the alias's
#: ``QUEUES`` does not list; reported by the backend's system check.
_UNLISTED_QUEUES: dict[tuple[str, str], str] = {}


def dispatch_aliases() -> list[str]:
    """The TASKS aliases whose backend is a DispatchBackend, sorted."""
    return sorted(alias for alias in getattr(settings, "TASKS", {}) if backend_for(alias))


def namespaces_with_databases() -> set[str]:
    """The namespaces of the DispatchBackend aliases with ``OPTIONS["DATABASE"]``."""
    found = set()
    for alias in dispatch_aliases():
        backend = backend_for(alias)
        if backend is not None and alias_database(alias):
            found.add(backend.namespace)
    return found


def namespace_of(alias: str | None) -> str:
    """``namespace_for(alias)``; for None, the ``"default"`` alias's namespace, or
    ``""`` on a site whose ``"default"`` is not a DispatchBackend."""
    if alias is None:
        default = backend_for("default")
        return default.namespace if default is not None else ""
    return namespace_for(alias)  # an unknown alias: ValueError naming the right ones


def namespace_for(alias: str) -> str:
    """The namespace of the DispatchBackend under TASKS alias ``alias``.

    For the functions that create rows from an alias (``Workflow.start``,
    cron entries, ``rundispatch --backend``). An alias that is not a
    DispatchBackend is a ``ValueError`` naming the ones that are: nothing is
    written under a namespace nobody asked for.
    """
    backend = backend_for(alias)
    if backend is None:
        raise ValueError(
            f"TASKS has no DispatchBackend alias {alias!r}; "
            f"DispatchBackend aliases: {dispatch_aliases()}."
        )
    return backend.namespace


def alias_serving(namespace: str, prefer: str) -> str:
    """The TASKS alias a job of ``namespace`` is recorded under: ``prefer``
    (the task's own backend) when its namespace is ``namespace``, else the
    first DispatchBackend alias whose namespace it is (``"default"`` first),
    else ``prefer``.

    A cron entry or a workflow step runs in the namespace of the alias that
    made it, whatever backend its task names. Its job must record an alias
    of that namespace: ``get_result`` and ``TaskResult.refresh`` read from
    the recorded alias's database, and a namespace lives in one database
    (check E082), so any alias of the namespace finds the row.
    """
    own = backend_for(prefer)
    if own is not None and own.namespace == namespace:
        return prefer
    aliases = sorted(dispatch_aliases(), key=lambda alias: (alias != "default", alias))
    for alias in aliases:
        backend = backend_for(alias)
        if backend is not None and backend.namespace == namespace:
            return alias
    return prefer


def backend_for(alias: str) -> DispatchBackendBase | None:
    """The DispatchBackend configured under ``alias``, or None."""
    try:
        backend = task_backends[alias]
    except Exception:
        return None
    return backend if isinstance(backend, DispatchBackendBase) else None
