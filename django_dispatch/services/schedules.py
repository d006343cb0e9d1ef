"""Cron entries made and managed from code: ``django_dispatch.schedules``.

An entry saved here is the code's (``CronEntry.Source.CODE``): the
``DISPATCH["CRON"]`` sync never updates or disables it, and a name the
settings define is refused, since the next worker start would take it back.
Every argument is checked before anything is written; a bad one raises
``ValueError`` or ``TypeError`` naming it. Firing is the scheduler's, as for
every entry: a slot fires once across the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone as dj_timezone
from django.utils.module_loading import import_string

from ..compat import InvalidTask, Task
from ..conf import get_settings
from ..core import cron
from ..core.encoding import dumps
from ..models import CronEntry
from ..queries.reading import read_alias
from ..store import database_for, using_backend
from ..store.schedules import (
    cron_entry_delete_named,
    cron_entry_save,
    cron_entry_set_enabled_named,
)
from ..tasks.registry import DispatchBackendBase, namespace_for
from ..tasks.task import check_arguments

__all__ = ["delete", "get", "list_entries", "save", "set_enabled"]

NAME_MAX_LENGTH = CronEntry._meta.get_field("name").max_length or 200


def save(
    name: str,
    *,
    schedule: str,
    task: Task | str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    timezone: str = "UTC",
    enabled: bool = True,
    backend: str = "default",
) -> CronEntry:
    """Create entry ``name`` in ``backend``'s namespace, or update it; return it.

    ``task``: a Task or its import path; its queue and priority are the
    entry's. A new schedule or time zone, or an entry enabled again,
    schedules from now on (no slot of the old schedule fires).
    """
    namespace = namespace_for(backend)
    _check_name(name, namespace)
    the_task = _task(task)
    _check_queue(the_task)
    args, kwargs = _arguments(the_task, args, kwargs)
    _check_schedule(schedule, timezone)
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {enabled!r}.")
    values = {
        "schedule": schedule,
        "timezone": timezone,
        "task_path": the_task.module_path,
        "args": args,
        "kwargs": kwargs,
        "queue_name": the_task.queue_name,
        "priority": the_task.priority,
        "enabled": enabled,
    }
    db = database_for(backend)
    for attempt in range(2):  # two first saves of one name race on the insert
        try:
            with transaction.atomic(using=db):
                return cron_entry_save(namespace, name, values, db=db)
        except IntegrityError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def delete(name: str, *, backend: str = "default") -> bool:
    """Delete entry ``name``; True when it existed. The jobs it enqueued stay."""
    namespace = namespace_for(backend)
    _check_name(name, namespace, action="delete")
    with using_backend(backend):
        return cron_entry_delete_named(namespace, name)


def set_enabled(
    name: str,
    enabled: bool,
    *,
    next_run_at: datetime | None = None,
    backend: str = "default",
) -> bool:
    """Enable or disable entry ``name``; True when this call changed it
    (False for an unknown name or one already so).

    Enabling schedules it from now on: slots missed while disabled do not
    fire. A name ``DISPATCH["CRON"]`` defines is refused (``ValueError``): the
    next worker start would undo the change; pause those from the admin or
    in the settings. With ``next_run_at`` (an aware datetime; ``enabled`` must be True),
    it fires first at that instant, once, then on its schedule.
    """
    namespace = namespace_for(backend)
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}.")
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {enabled!r}.")
    _check_name(name, namespace, action="enable" if enabled else "disable")
    if next_run_at is not None:
        if not isinstance(next_run_at, datetime) or dj_timezone.is_naive(next_run_at):
            raise TypeError(
                "next_run_at must be an aware datetime (e.g. "
                f"timezone.now() + timedelta(hours=1)), got {next_run_at!r}."
            )
        if not enabled:
            raise ValueError(
                "next_run_at is the first fire of an enabled entry: pass enabled=True."
            )
    with using_backend(backend):
        return cron_entry_set_enabled_named(namespace, name, enabled, next_run_at=next_run_at)


def get(name: str, *, backend: str = "default") -> CronEntry | None:
    """Entry ``name`` of ``backend``'s namespace, whatever made it; None if there is none."""
    namespace = namespace_for(backend)
    with using_backend(backend):
        return _read().filter(namespace=namespace, name=name).first()


def list_entries(*, backend: str = "default") -> list[CronEntry]:
    """Every entry of ``backend``'s namespace (settings', code's, the admin's), by name."""
    namespace = namespace_for(backend)
    with using_backend(backend):
        return list(_read().filter(namespace=namespace).order_by("name"))


def _read() -> Any:
    """What ``get`` and ``list_entries`` read: an operator's view, so the read replica."""
    return CronEntry.objects.using(read_alias())


def _check_name(name: Any, namespace: str, *, action: str = "save") -> None:
    if not isinstance(name, str) or not name or len(name) > NAME_MAX_LENGTH:
        raise ValueError(
            f"name must be a non-empty string of at most {NAME_MAX_LENGTH} characters, "
            f"got {name!r}."
        )
    if name in settings_names(namespace):
        raise ValueError(
            f"Cron entry {name!r} is defined in DISPATCH['CRON']: the settings own it, and "
            f"the next worker start would undo a {action} from code. Change it in the "
            "settings, or give the entry made in code another name."
        )


def settings_names(namespace: str) -> set[str]:
    """The names ``DISPATCH["CRON"]`` defines for ``namespace`` (by each entry's
    ``"backend"`` alias, default ``"default"``)."""
    names = set()
    for entry_name, spec in get_settings().CRON.items():
        alias = spec.get("backend", "default") if isinstance(spec, dict) else "default"
        try:
            if namespace_for(alias) == namespace:
                names.add(entry_name)
        except ValueError:
            continue  # an unknown alias: system check E03x reports it
    return names


def _task(task: Any) -> Task:
    if isinstance(task, Task):
        return task
    if not isinstance(task, str) or not task:
        raise TypeError(
            f"task must be a Task or its import path such as 'shop.tasks.nightly', got {task!r}."
        )
    try:
        found = import_string(task)
    except ImportError as e:
        raise ValueError(f"task {task!r} cannot be imported: {e}.") from e
    if not isinstance(found, Task):
        raise ValueError(
            f"task {task!r} is a {type(found).__name__}, not a Task: name a function "
            "decorated with @task."
        )
    return found


def _check_queue(task: Task) -> None:
    """The scheduler enqueues through the task's own backend: its queue must be one
    that backend accepts, or every slot would fail to enqueue."""
    backend = task.get_backend()
    problem = (
        backend.queue_problem(task.module_path, task.queue_name)
        if isinstance(backend, DispatchBackendBase)
        else f"it uses {type(backend).__name__}, not a DispatchBackend"
    )
    if problem is not None:
        raise ValueError(f"task {task.module_path} cannot be scheduled: {problem}")


def _arguments(task: Task, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise TypeError(f"args must be a list or tuple, got {args!r}.")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict, got {kwargs!r}.")
    for field, value in (("args", list(args)), ("kwargs", dict(kwargs))):
        try:
            dumps(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{field} must be JSON (the job stores it as JSON): {e}.") from e
    try:
        check_arguments(task, list(args), dict(kwargs))
    except InvalidTask as e:
        raise TypeError(f"args/kwargs do not fit the task: {e}") from e
    return list(args), dict(kwargs)


def _check_schedule(schedule: Any, timezone: Any) -> None:
    if not isinstance(timezone, str) or not timezone:
        raise ValueError(f"timezone must be an IANA name such as 'Europe/Paris', got {timezone!r}.")
    try:
        cron.validate("* * * * *", timezone)
    except cron.CronError as e:
        raise ValueError(f"timezone: {e}") from e
    if not isinstance(schedule, str) or not schedule:
        raise ValueError(
            f"schedule must be a cron expression such as '0 3 * * *', got {schedule!r}."
        )
    try:
        cron.validate(schedule, timezone)
    except cron.CronError as e:
        raise ValueError(f"schedule: {e}") from e
