"""Scheduling: each ``DISPATCH["CRON"]`` entry, its schedule, time zone, policy and task.

An entry is checked key by key and every problem is reported, so that one
``manage.py check`` lists all that is wrong with it; only an entry that is not
a dict, or lacks a required key, is not read further.
"""

from typing import Any

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from ..compat import Task
from ..conf import CRON_ENTRY_KEYS, did_you_mean
from ..core import cron
from ..core.docs_links import docs_url
from .aliases import dispatch_backend_options

SEE = f"See {docs_url('scheduling', 'declaring-entries-in-settings')}"
REQUIRED = ("schedule", "task")
#: Optional keys whose value must be of one type.
TYPED_KEYS = (("args", list), ("kwargs", dict), ("queue_name", str))


def check_cron_entries(entries: dict[str, Any]) -> list[checks.CheckMessage]:
    """Each DISPATCH["CRON"] entry: a valid schedule, time zone, policy and task."""
    messages: list[checks.CheckMessage] = []
    for name, spec in entries.items():
        messages += _check_entry(f"DISPATCH['CRON'][{name!r}]", spec)
    return messages


def _check_entry(where: str, spec: Any) -> list[checks.CheckMessage]:
    """The messages for one entry, ``where`` naming it in each."""
    if not isinstance(spec, dict):
        return [
            checks.Error(
                f"{where} must be a dict with at least 'schedule' and 'task', "
                f"got {type(spec).__name__}.",
                hint=SEE,
                id="django_dispatch.E030",
            )
        ]
    # Unknown keys first: a misspelt 'schedule' is reported as the typo it
    # is, not only as a missing key; a misspelt optional key ('timzone')
    # would otherwise be ignored and its default used.
    messages = _check_unknown_keys(where, spec)
    missing = [key for key in REQUIRED if key not in spec]
    if missing:
        return [*messages, _missing_keys_error(where, missing)]
    return [
        *messages,
        *_check_schedule(where, spec),
        *_check_value_types(where, spec),
        *_check_priority(where, spec),
        *_check_backend(where, spec),
        *_check_misfire_policy(where, spec),
        *_check_task(where, spec),
    ]


def _check_unknown_keys(where: str, spec: dict[Any, Any]) -> list[checks.CheckMessage]:
    return [
        checks.Error(
            f"{where} has an unknown key {key!r}.{did_you_mean(key, CRON_ENTRY_KEYS)}",
            hint=f"An entry's keys are {', '.join(map(repr, CRON_ENTRY_KEYS))}. {SEE}",
            id="django_dispatch.E035",
        )
        for key in sorted(set(spec) - set(CRON_ENTRY_KEYS), key=str)
    ]


def _missing_keys_error(where: str, missing: list[str]) -> checks.CheckMessage:
    return checks.Error(
        f"{where} must be a dict with at least 'schedule' and 'task'; "
        f"{' and '.join(map(repr, missing))} missing.",
        hint=SEE,
        id="django_dispatch.E030",
    )


def _check_schedule(where: str, spec: dict[str, Any]) -> list[checks.CheckMessage]:
    """The cron expression, read in the entry's time zone (the site's by default)."""
    try:
        cron.validate(spec["schedule"], spec.get("timezone") or settings.TIME_ZONE)
    except cron.CronError as e:
        return [checks.Error(f"{where}: {e}", hint=SEE, id="django_dispatch.E031")]
    return []


def _check_value_types(where: str, spec: dict[str, Any]) -> list[checks.CheckMessage]:
    return [
        checks.Error(
            f"{where}: {key!r} must be a {kind.__name__}, got {spec[key]!r}.",
            hint=SEE,
            id="django_dispatch.E034",
        )
        for key, kind in TYPED_KEYS
        if key in spec and not isinstance(spec[key], kind)
    ]


def _check_priority(where: str, spec: dict[str, Any]) -> list[checks.CheckMessage]:
    priority = spec.get("priority", 0)
    # bool is an int to Python, but True is not a priority.
    if isinstance(priority, int) and not isinstance(priority, bool) and -100 <= priority <= 100:
        return []
    return [
        checks.Error(
            f"{where}: 'priority' must be a whole number from -100 to 100, got {priority!r}.",
            hint=SEE,
            id="django_dispatch.E034",
        )
    ]


def _check_backend(where: str, spec: dict[str, Any]) -> list[checks.CheckMessage]:
    alias = spec.get("backend", "default")
    aliases = dispatch_backend_options()
    if alias in aliases:
        return []
    return [
        checks.Error(
            f"{where}: 'backend' {alias!r} is not a TASKS alias using DispatchBackend "
            f"(those are {sorted(aliases)}).",
            hint=SEE,
            id="django_dispatch.E036",
        )
    ]


def _check_misfire_policy(where: str, spec: dict[str, Any]) -> list[checks.CheckMessage]:
    policy = spec.get("misfire_policy", cron.SKIP)
    if policy in cron.POLICIES:
        return []
    return [
        checks.Error(
            f"{where}: misfire_policy {policy!r} is not one of {list(cron.POLICIES)}."
            f"{did_you_mean(policy, cron.POLICIES)}",
            hint=f"See {docs_url('scheduling', 'missed-slots-misfire-policies')}",
            id="django_dispatch.E032",
        )
    ]


def _check_task(where: str, spec: dict[str, Any]) -> list[checks.CheckMessage]:
    """The task path imports, and what it names is a Task (decorated with @task)."""
    try:
        task = import_string(spec["task"])
    except ImportError as e:
        return [
            checks.Error(
                f"{where}: task {spec['task']!r} cannot be imported ({e}).",
                hint="Give the import path of a function decorated with @task.",
                id="django_dispatch.E033",
            )
        ]
    if isinstance(task, Task):
        return []
    return [
        checks.Error(
            f"{where}: {spec['task']!r} is not a Task; decorate it with @task.",
            hint=SEE,
            id="django_dispatch.E033",
        )
    ]
