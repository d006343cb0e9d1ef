"""The one place that imports Django's Tasks API, whichever Django provides it.

Django 6.0 and later ship the Tasks framework as ``django.tasks``; Django 5.2
LTS gets the same API from the ``django-tasks`` backport package, imported as
``django_tasks`` (``pip install "django-dispatch[backport]"``). Every other
module of django_dispatch imports ``Task``, ``TaskResult``, the signals and
the rest from here, so a version difference is handled once, in this file,
and nowhere else asks which Django it runs on.

Differences handled here:

- Module: ``django.tasks`` (6.0+) or ``django_tasks`` (5.2 + backport).
- Exception names: the backport calls them ``InvalidTaskError`` and
  ``InvalidTaskBackendError``; they are exported as ``InvalidTask`` and
  ``InvalidTaskBackend``, the names Django uses.
- Logger: records of Django's own task signals go to ``django.tasks`` or to
  ``django_tasks``; ``TASKS_LOGGER`` names the one in use.
- ``@task`` options: Django 6.1 and the backport pass extra keyword
  arguments of ``task()`` (``max_attempts``, ``backoff``, ``timeout``, ...)
  to the backend's ``task_class``; Django 6.0's ``task()`` accepts none and
  raises ``TypeError``. ``TASK_DECORATOR_TAKES_OPTIONS`` says which, and
  ``task_with_options`` (exported as ``django_dispatch.task``) is a
  decorator that takes them on every supported version.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, Literal, overload

import django
from django.core.exceptions import ImproperlyConfigured

#: Where the Tasks API comes from: "django.tasks" or "django_tasks".
TASKS_MODULE: str

# TYPE_CHECKING: mypy runs on the newest Django and checks this branch only.
if TYPE_CHECKING or django.VERSION >= (6, 0):
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.backends.dummy import DummyBackend
    from django.tasks.backends.immediate import ImmediateBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TaskError,
    )
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskException,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import (
        log_task_enqueued,
        log_task_finished,
        log_task_started,
        task_enqueued,
        task_finished,
        task_started,
    )
    from django.utils.json import normalize_json

    TASKS_MODULE = "django.tasks"
    TASKS_LOGGER = "django.tasks"
else:
    # django.tasks registers its system checks (each backend's check()) on
    # import; the backport only in its AppConfig.ready(). Importing them here
    # makes our backend's checks run whether or not "django_tasks" is in
    # INSTALLED_APPS (its signal receivers are registered by the signals import).
    try:
        import django_tasks.checks  # noqa: F401
    except ImportError as e:
        raise ImproperlyConfigured(
            f"django_dispatch needs Django's Tasks framework. Django {django.get_version()} "
            "does not include it (Django 6.0 and later do): install the backport with "
            '`pip install "django-dispatch[backport]"` (or `pip install django-tasks`) and '
            'add "django_tasks" to INSTALLED_APPS, or upgrade Django to 6.0 or later. '
            "See https://github.com/django-dispatch/django-dispatch/blob/main/docs/install.md#django-52-lts"
        ) from e
    from django_tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        default_task_backend,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.backends.dummy import DummyBackend
    from django_tasks.backends.immediate import ImmediateBackend
    from django_tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
        task,
    )
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import (
        TaskException,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django_tasks.signals import (
        log_task_enqueued,
        log_task_finished,
        log_task_started,
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.utils import normalize_json

    TASKS_MODULE = "django_tasks"
    TASKS_LOGGER = "django_tasks"


#: Whether ``task()`` passes extra keyword arguments to the backend's
#: ``task_class`` (Django 6.1+, django-tasks 0.12+), rather than refusing
#: them (Django 6.0). Read from the signature, not from a version number.
TASK_DECORATOR_TAKES_OPTIONS: bool = any(
    p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(task).parameters.values()
)


# The overloads of django-stubs' ``task``, with the backend's options: a user's
# ``@django_dispatch.task(...)`` function is a ``Task[P, R]`` under ``mypy --strict``.
@overload
def task_with_options[**P, R](
    function: Callable[Concatenate[TaskContext, P], R],
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[True],
    **options: Any,
) -> Task[P, R]: ...
@overload
def task_with_options[**P, R](
    function: Callable[P, R],
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[False] = False,
    **options: Any,
) -> Task[P, R]: ...
@overload
def task_with_options[**P, R](
    function: None = None,
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[True],
    **options: Any,
) -> Callable[[Callable[Concatenate[TaskContext, P], R]], Task[P, R]]: ...
@overload
def task_with_options[**P, R](
    function: None = None,
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[False] = False,
    **options: Any,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...
def task_with_options(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    **options: Any,
) -> Any:
    """Django's ``@task`` decorator, taking the backend's own options on every Django.

    Exported as ``django_dispatch.task``. Same arguments and result as
    Django 6.1's ``task()``: the extra keyword ``options`` (``max_attempts``,
    ``backoff``, ``timeout``, ...) go to the backend's ``task_class``, which
    validates them. Needed on Django 6.0, whose ``task()`` refuses them;
    elsewhere it builds the same Task as Django's own decorator, from an
    import that works on every supported version.
    """
    if "run_after" in options:
        raise TypeError(
            "run_after cannot be defined statically with the @task decorator. "
            "Use .using(run_after=...) to set it dynamically."
        )

    def wrapper(f: Callable[..., Any]) -> Any:
        task_class = task_backends[backend].task_class
        try:
            return task_class(
                func=f,
                priority=priority,
                queue_name=queue_name,
                backend=backend,
                takes_context=takes_context,
                run_after=None,
                **options,
            )
        except TypeError as e:
            if not options:
                raise
            raise TypeError(
                f"Task options {sorted(options)} are not accepted by backend {backend!r} "
                f"({task_class.__module__}.{task_class.__qualname__}): {e}. They need "
                "django_dispatch.backend.DispatchBackend as that backend."
            ) from e

    if function:
        return wrapper(function)
    return wrapper


# --- The admin -----------------------------------------------------------------------

#: Whether an admin action can be offered on an object's change page as well as
#: on the change list (Django 6.1: ``@admin.action(location=[...])``). Django 5.2
#: and 6.0 offer admin actions on the change list only.
ADMIN_ACTIONS_ON_CHANGE_PAGE: bool = django.VERSION >= (6, 1)

#: ``admin_action(location=...)``: offer the action on the change list and on
#: each object's change page (the names of ``django.contrib.admin.ActionLocation``).
ON_LIST_AND_PAGE: tuple[str, ...] = ("CHANGE_LIST", "CHANGE_FORM")


def admin_action(
    function: Callable[..., Any] | None = None,
    *,
    location: tuple[str, ...] = ("CHANGE_LIST",),
    **kwargs: Any,
) -> Any:
    """``django.contrib.admin.action``, with ``location`` kept only where Django has it.

    ``location`` names ``ActionLocation`` members. Before Django 6.1 it is
    dropped: the action is offered on the change list only, where operators
    select the row instead. ``django.contrib.admin`` is imported here, not at
    module level, so that sites without the admin (and workers) never load it.
    """
    from django.contrib import admin

    if ADMIN_ACTIONS_ON_CHANGE_PAGE:
        kwargs["location"] = [admin.ActionLocation[name] for name in location]
    return admin.action(function, **kwargs)


# --- Templates -----------------------------------------------------------------------

if TYPE_CHECKING or django.VERSION >= (6, 1):
    from django.template.defaulttags import csp_nonce_attr
else:

    def csp_nonce_attr(context: Any, media: Any = None) -> str:
        """``{% csp_nonce_attr %}`` before Django 6.1 made it a built-in tag.

        The ``nonce="..."`` attribute when the context has a CSP nonce (Django
        6.0's ``csp`` context processor puts one there as ``csp_nonce``),
        else nothing; with ``media``, the media's tags as they are. Our admin
        templates load it from ``dispatch_compat`` so they render on 5.2 and 6.0.
        """
        from django.utils.html import format_html

        if media:
            return media.render()
        nonce = context.get("csp_nonce")
        return "" if nonce is None else format_html('nonce="{}"', nonce)


__all__ = [
    "ADMIN_ACTIONS_ON_CHANGE_PAGE",
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "ON_LIST_AND_PAGE",
    "TASKS_LOGGER",
    "TASKS_MODULE",
    "TASK_DECORATOR_TAKES_OPTIONS",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "DummyBackend",
    "ImmediateBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskException",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "admin_action",
    "csp_nonce_attr",
    "default_task_backend",
    "log_task_enqueued",
    "log_task_finished",
    "log_task_started",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
    "task_with_options",
]
