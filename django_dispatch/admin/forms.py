"""Forms of the admin: a dead letter's corrected arguments, and cron entries.

Both are validated here, before anything is written, so that an operator
sees a field error instead of a job that fails at 03:00: JSON of the right
shape, a schedule and time zone the scheduler accepts, a task path that
imports to a real ``django.tasks.Task`` whose signature takes the arguments.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.utils.module_loading import import_string

from ..checks import namespace_problem
from ..compat import InvalidTask, Task
from ..core import cron
from ..models import CronEntry
from ..services import cron_task
from ..tasks.task import check_arguments

#: Any valid expression: checks a time zone on its own.
_ANY_SCHEDULE = "* * * * *"


class PrettyJSONField(forms.JSONField):
    """A JSON text area shown indented, that accepts ``[]`` and ``{}``.

    Django's JSONField treats empty containers as "no value" when required,
    so this one is optional at the field level and its owner checks the
    shape (list or dict) instead.
    """

    def __init__(self, rows: int = 6, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": rows, "cols": 60}))
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json.dumps(value, indent=2, ensure_ascii=False)


def json_list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise forms.ValidationError(
            'Enter a JSON list of positional arguments, e.g. [42, "a"] ([] for none).'
        )
    return value


def json_dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise forms.ValidationError(
            'Enter a JSON object of keyword arguments, e.g. {"user_id": 42} ({} for none).'
        )
    return value


class ReplayForm(forms.Form):
    """Corrected arguments for one replay; the task's signature is checked by the replay."""

    args = PrettyJSONField(label="Positional arguments (JSON list)")
    kwargs = PrettyJSONField(label="Keyword arguments (JSON object)")

    def clean_args(self) -> list[Any]:
        return json_list(self.cleaned_data.get("args"))

    def clean_kwargs(self) -> dict[str, Any]:
        return json_dict(self.cleaned_data.get("kwargs"))


def load_task(path: str) -> Task:
    """The ``Task`` at ``path``, or a ValidationError saying what is wrong."""
    try:
        task = import_string(path)
    except ImportError as e:
        raise forms.ValidationError(
            f"{path!r} cannot be imported ({e}). Give the import path of a function "
            "decorated with @task, e.g. myapp.tasks.nightly_report."
        ) from e
    if not isinstance(task, Task):
        raise forms.ValidationError(
            f"{path!r} is a {type(task).__name__}, not a Task: decorate the function with @task."
        )
    return task


class CronEntryForm(forms.ModelForm):
    """The definition of a cron entry, checked as the scheduler will use it."""

    args = PrettyJSONField(label="Arguments (JSON list)", initial=list, rows=3)
    kwargs = PrettyJSONField(label="Keyword arguments (JSON object)", initial=dict, rows=3)

    class Meta:
        model = CronEntry
        fields = [
            "name",
            "namespace",
            "schedule",
            "timezone",
            "task_path",
            "args",
            "kwargs",
            "queue_name",
            "priority",
            "misfire_policy",
            "enabled",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "timezone" in self.fields and not self.instance.pk:
            self.fields["timezone"].initial = settings.TIME_ZONE

    def clean_args(self) -> list[Any]:
        return json_list(self.cleaned_data.get("args"))

    def clean_kwargs(self) -> dict[str, Any]:
        return json_dict(self.cleaned_data.get("kwargs"))

    def clean_namespace(self) -> str:
        """The namespace whose workers fire the entry; a namespace's rules apply."""
        namespace = (self.cleaned_data.get("namespace") or "").strip()
        problem = namespace_problem(namespace)
        if problem:
            raise forms.ValidationError(f"The namespace {problem}.")
        return namespace

    def clean_timezone(self) -> str:
        timezone = self.cleaned_data["timezone"].strip()
        try:
            cron.validate(_ANY_SCHEDULE, timezone)
        except cron.CronError as e:
            raise forms.ValidationError(str(e)) from e
        return timezone

    def clean_schedule(self) -> str:
        schedule = " ".join(self.cleaned_data["schedule"].split())
        try:
            cron.validate(schedule, "UTC")
        except cron.CronError as e:
            raise forms.ValidationError(str(e)) from e
        return schedule

    def clean_task_path(self) -> str:
        path = self.cleaned_data["task_path"].strip()
        load_task(path)
        return path

    def clean(self) -> dict[str, Any]:
        """Check the task as the scheduler will enqueue it: queue, priority, arguments."""
        data = super().clean() or {}
        needed = ("task_path", "args", "kwargs", "queue_name", "priority")
        if any(name not in data for name in needed):
            return data  # a field error is already shown
        entry = CronEntry(**{name: data[name] for name in needed})
        try:
            task = cron_task(entry)
            task.get_backend().validate_task(task)
        except InvalidTask as e:
            raise forms.ValidationError(f"The task cannot be enqueued this way: {e}") from e
        except Exception as e:  # e.g. the task's backend is not configured
            raise forms.ValidationError(f"The task cannot be enqueued: {e}") from e
        try:
            check_arguments(task, data["args"], data["kwargs"])
        except InvalidTask as e:
            self.add_error("args", str(e))
        return data
