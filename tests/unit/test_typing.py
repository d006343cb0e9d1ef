"""A user's code type-checks under ``mypy --strict`` against the public API.

The package ships ``py.typed``, so a site's mypy reads our annotations; these
tests run mypy the way a user would (strict, django-stubs' plugin) on a
snippet that uses the public functions, and check that a misuse is caught,
so the check cannot pass by reading everything as ``Any``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # runs mypy in a subprocess

SNIPPET = """
from datetime import timedelta
from typing import Any

from django.tasks import TaskContext
from django.utils import timezone

from django_dispatch import (
    cancel, dead_letters, enqueue_many, jobs, pause_queue, replay, schedules, task,
)
from django_dispatch.models import CronEntry, DeadLetter, Job
from django_dispatch.testing import drain
from django_dispatch.workflows import count_runs, list_runs


@task(queue_name="emails", max_attempts=3, timeout=30)
def send_welcome(user_id: int) -> str:
    return f"sent {user_id}"


@task(takes_context=True)
def reindex(context: TaskContext[Any, Any], total: int) -> int:
    return total


def enqueue() -> str:
    result = send_welcome.using(partition_key="u:1", priority=5).enqueue(1)
    value: str = result.return_value
    reindex.enqueue(10)
    ids = enqueue_many(send_welcome, [((i,), {}) for i in range(3)])
    return value + result.id + str(len(ids)) + str(cancel(result.id))


def page() -> list[Job]:
    failed: list[Job] = jobs.list(state="failed", task=send_welcome, limit=50)
    return jobs.list(before=failed[-1].pk) if failed else failed


def letters() -> int:
    letter: DeadLetter | None = dead_letters.for_job("42")
    if letter is not None:
        replay(letter.pk)
    return dead_letters.count(replayed=False) + len(dead_letters.list(task="a.b"))


def cron() -> bool:
    entry: CronEntry = schedules.save("nightly", schedule="0 3 * * *", task=send_welcome, args=[1])
    entries: list[CronEntry] = schedules.list()
    assert entry in entries and pause_queue("emails") in (True, False)
    return schedules.set_enabled("nightly", True, next_run_at=timezone.now() + timedelta(hours=1))


def operate() -> int:
    return drain() + jobs.count(queue="emails") + count_runs() + len(list_runs(state="stuck"))
"""

CONFIG = """
[mypy]
strict = True
plugins = mypy_django_plugin.main

[mypy.plugins.django-stubs]
django_settings_module = tests.settings

# As for an installed package: mypy reports errors in the user's code only.
[mypy-django_dispatch.*]
ignore_errors = True
"""


def _mypy(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "mypy.ini").write_text(CONFIG)
    (tmp_path / "snippet.py").write_text(textwrap.dedent(code))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(tmp_path / "mypy.ini"),
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            str(tmp_path / "snippet.py"),
        ],
        cwd=ROOT,
        env={**os.environ, "DISPATCH_TEST_DB": "sqlite"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_py_typed_ships_in_the_package():
    assert (ROOT / "django_dispatch" / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()


def test_a_users_snippet_type_checks_under_mypy_strict(tmp_path):
    checked = _mypy(tmp_path, SNIPPET)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_misuse_of_the_public_api_is_reported(tmp_path):
    wrong = (
        SNIPPET
        + """

def wrong() -> None:
    jobs.list(limit="ten")
    send_welcome.enqueue("not an int")
    schedules.set_enabled("nightly", "yes")
"""
    )
    checked = _mypy(tmp_path, wrong)
    assert checked.returncode == 1
    assert 'Argument "limit" to "jobs_list" has incompatible type "str"' in checked.stdout
    assert 'Argument 1 to "enqueue" of "DispatchTask" has incompatible type "str"' in checked.stdout
    assert 'Argument 2 to "set_enabled" has incompatible type "str"' in checked.stdout
