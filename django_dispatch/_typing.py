"""What type checkers see as ``django_dispatch.task``: never imported at run time.

At run time ``django_dispatch.task`` is ``compat.task_with_options``, which
builds the backend's ``task_class`` (``DispatchTask`` for ours). These
overloads, those of django-stubs' ``task`` with our options added, give a
decorated function the type ``DispatchTask[P, R]``: under ``mypy --strict`` a
user's ``enqueue()`` arguments, results and ``using(partition_key=...)``
type-check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Literal, overload

from .compat import TaskContext
from .tasks.task import DispatchTask

__all__ = ["task"]


@overload
def task[**P, R](
    function: Callable[Concatenate[TaskContext, P], R],
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    atomic: bool = ...,
    takes_context: Literal[True],
    **options: Any,
) -> DispatchTask[P, R]: ...
@overload
def task[**P, R](
    function: Callable[P, R],
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    atomic: bool = ...,
    takes_context: Literal[False] = False,
    **options: Any,
) -> DispatchTask[P, R]: ...
@overload
def task[**P, R](
    function: None = None,
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    atomic: bool = ...,
    takes_context: Literal[True],
    **options: Any,
) -> Callable[[Callable[Concatenate[TaskContext, P], R]], DispatchTask[P, R]]: ...
@overload
def task[**P, R](
    function: None = None,
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    atomic: bool = ...,
    takes_context: Literal[False] = False,
    **options: Any,
) -> Callable[[Callable[P, R]], DispatchTask[P, R]]: ...
def task(function: Any = None, **options: Any) -> Any:
    from .compat import task_with_options

    return task_with_options(function, **options)
