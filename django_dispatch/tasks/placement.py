"""Where a task's jobs may run (#16): its needs and locality, worked out at enqueue.

``resources="auto"`` is resolved here, from the task's usage history, each
time an enqueue plan is made (an auto task's plan is not kept, so its needs
follow its history). Jobs carry their resolved needs: a worker compares
numbers, never history.
"""

from __future__ import annotations

from dataclasses import replace

from ..compat import Task
from ..core.resources import AUTO, check_needs, shape_of
from ..store.enqueue import JobSpec


def is_auto(task: Task) -> bool:
    return getattr(task, "resources", None) == AUTO


def place(spec: JobSpec, task: Task) -> JobSpec:
    """``spec`` with the task's resolved needs, their shape and its locality."""
    resources = getattr(task, "resources", None)
    locality = getattr(task, "locality", None)
    if resources is None and locality is None:
        return spec
    if resources == AUTO:
        from ..usage import auto_needs

        needs = auto_needs(spec.task_path, spec.namespace)
    else:
        needs = check_needs(resources)
    return replace(spec, resources=needs, resource_shape=shape_of(needs), locality=locality)
