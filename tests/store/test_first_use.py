"""What a new user trips on first, from the docs in a fresh project: each mistake
gets a message that says what is wrong and what to do, and nothing is written.

The fresh-project cases run ``manage.py``-style commands in a subprocess with a
settings module of their own (a site without django_dispatch installed cannot
share this test process's app registry).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.db.transaction import TransactionManagementError

from django_dispatch import testing
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from tests.conftest import ROOT
from tests.testapp import tasks

# --- testing.drain() inside a transaction ---------------------------------------------------


@pytest.mark.django_db  # the test runs inside a transaction, as django.test.TestCase does
def test_drain_inside_a_transaction_refuses_with_the_fix_and_runs_nothing():
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(TransactionManagementError) as caught:
        testing.drain()
    message = str(caught.value)
    assert "TransactionTestCase" in message
    assert "django_db(transaction=True)" in message
    assert "Nothing was run" in message
    assert Job.objects.get(pk=int(result.id)).state == JobState.PENDING


@pytest.mark.django_db(transaction=True)
def test_drain_inside_atomic_refuses_too_and_works_once_committed():
    result = tasks.add.enqueue(1, 2)
    with transaction.atomic(), pytest.raises(TransactionManagementError):
        testing.drain()
    assert testing.drain() == 1
    assert Job.objects.get(pk=int(result.id)).state == JobState.SUCCEEDED


# --- rundispatch's numeric arguments -------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "value", "expected"),
    [
        ("--concurrency", "100000", "must be a whole number from 1 to 1000"),
        ("--concurrency", "0", "must be a whole number from 1 to 1000"),
        ("--concurrency", "four", "must be a whole number from 1 to 1000"),
        ("--processes", "0", "must be a whole number from 1 to 256"),
        ("--async-concurrency", "-1", "must be a whole number from 0 to 10000"),
        ("--max-jobs", "x", "must be a whole number of at least 1"),
        ("--metrics-port", "70000", "must be a port number from 0 to 65535"),
    ],
)
def test_bad_worker_numbers_are_refused_by_name_before_anything_starts(argument, value, expected):
    with pytest.raises(CommandError) as caught:
        call_command("rundispatch", argument, value)
    message = str(caught.value)
    assert f"argument {argument}: {expected}" in message
    assert f"got {value!r}" in message
    assert "_positive_int" not in message and "invalid" not in message


@pytest.mark.django_db
def test_a_concurrency_setting_out_of_bounds_is_refused_naming_the_setting(settings):
    settings.DISPATCH = {**settings.DISPATCH, "CONCURRENCY": 100_000}
    with pytest.raises(CommandError, match=r"DISPATCH\['CONCURRENCY'\] is 100000: it must be"):
        call_command("rundispatch", "--burst")


# --- a fresh project -----------------------------------------------------------------------

FRESH_TASKS = """
from django.tasks import task

@task(queue_name="sms")
def send_sms(number):
    return number
"""

FRESH_APPS = """
from django.apps import AppConfig

class FreshConfig(AppConfig):
    name = "fresh_app"

    def ready(self):
        from . import tasks  # noqa: F401  (a site importing its tasks at start-up)
"""


def _fresh_site(
    tmp_path: Path, *, installed: bool, queues: list[str], logging: str = ""
) -> dict[str, str]:
    app = tmp_path / "fresh_app"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text(FRESH_TASKS)
    (app / "apps.py").write_text(FRESH_APPS)
    apps = ["django.contrib.contenttypes", "django.contrib.auth", "fresh_app"]
    if installed:
        apps.append("django_dispatch")
    (tmp_path / "fresh_settings.py").write_text(
        textwrap.dedent(f"""
            SECRET_KEY = "fresh"
            USE_TZ = True
            INSTALLED_APPS = {apps!r}
            DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3",
                                       "NAME": {str(tmp_path / "db.sqlite3")!r}}}}}
            TASKS = {{"default": {{"BACKEND": "django_dispatch.backend.DispatchBackend",
                                   "QUEUES": {queues!r}}}}}
        """)
        + logging
    )
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "fresh_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=120
    )


ENQUEUE = """
import django
django.setup()
from fresh_app.tasks import send_sms
try:
    send_sms.enqueue("+100")
except Exception as e:
    print(type(e).__name__, e)
"""


@pytest.mark.slow
def test_missing_from_installed_apps_is_e001_and_enqueue_refuses(tmp_path):
    env = _fresh_site(tmp_path, installed=False, queues=[])
    checked = _run(env, "-m", "django", "check")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "(django_dispatch.E001) TASKS['default'] uses DispatchBackend but" in checked.stderr
    assert "Add 'django_dispatch' to INSTALLED_APPS" in checked.stderr
    enqueued = _run(env, "-c", ENQUEUE)
    assert enqueued.stdout.startswith("ImproperlyConfigured TASKS['default'] uses DispatchBackend")
    assert "Nothing was enqueued." in enqueued.stdout


UNLISTED = (
    "Task fresh_app.tasks.send_sms uses queue 'sms', which TASKS['default']['QUEUES'] does "
    "not list (it accepts ['default']). Add 'sms' to TASKS['default']['QUEUES']"
)


@pytest.mark.slow
def test_a_decorators_unlisted_queue_is_a_check_error_not_an_import_crash(tmp_path):
    env = _fresh_site(tmp_path, installed=True, queues=["default"])
    checked = _run(env, "-m", "django", "check")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr
    assert f"(django_dispatch.E005) {UNLISTED}" in checked.stderr
    _run(env, "-m", "django", "migrate", "-v0")
    enqueued = _run(env, "-c", ENQUEUE)
    assert enqueued.stdout.startswith(f"InvalidTask {UNLISTED}"), enqueued.stdout + enqueued.stderr


@pytest.mark.django_db
def test_an_unlisted_queue_given_with_using_is_refused_at_enqueue(settings):
    settings.TASKS = {
        **settings.TASKS,
        "default": {**settings.TASKS["default"], "QUEUES": ["default", "emails"]},
    }
    from django_dispatch.compat import InvalidTask, task_backends

    with pytest.raises(InvalidTask) as caught:
        tasks.add.using(queue_name="sms").enqueue(1, 2)
    assert str(caught.value).startswith(
        "Task tests.testapp.tasks.add uses queue 'sms', which TASKS['default']['QUEUES'] "
        "does not list (it accepts ['default', 'emails'])."
    )
    assert not Job.objects.exists()
    assert any(
        m.id == "django_dispatch.E005" and "tests.testapp.tasks.add" in m.msg
        for m in task_backends["default"].check()
    )


# --- the worker's own lines at INFO ----------------------------------------------------------


def _install_md_logging() -> str:
    """The LOGGING block docs/install.md gives under "Run a worker"."""
    text = (ROOT / "docs" / "install.md").read_text()
    section = text[text.index("## Run a worker") :]
    start = section.index("LOGGING = {")
    return section[start : section.index("```", start)]


@pytest.mark.slow
def test_the_worker_prints_its_start_line_with_the_logging_install_md_gives(tmp_path):
    silent = _fresh_site(tmp_path, installed=True, queues=[])
    (tmp_path / "fresh_app" / "tasks.py").write_text(FRESH_TASKS.replace('"sms"', '"default"'))
    assert _run(silent, "-m", "django", "migrate", "-v0").returncode == 0
    burst = ("-m", "django", "rundispatch", "--burst", "--concurrency", "1")
    quiet = _run(silent, *burst)
    assert quiet.returncode == 0, quiet.stderr
    assert "started: queues=all concurrency=1" not in quiet.stderr  # Django's default logging
    (tmp_path / "fresh_settings.py").write_text(
        (tmp_path / "fresh_settings.py").read_text() + "\n" + _install_md_logging()
    )
    told = _run(silent, *burst)
    assert told.returncode == 0, told.stderr
    assert "started: queues=all concurrency=1" in told.stderr


# --- what the docs must answer ---------------------------------------------------------------


@pytest.mark.slow  # runs ruff
def test_testing_md_examples_import_every_name_they_use(tmp_path):
    """A user pastes testing.md's examples: each must name only what it imports
    (the first one used ``User`` without importing it)."""
    text = (ROOT / "docs" / "testing.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks
    for n, block in enumerate(blocks):
        (tmp_path / f"block_{n}.py").write_text(block)
    ruff = Path(sys.executable).parent / "ruff"
    checked = subprocess.run(
        [str(ruff), "check", "--isolated", "--select", "F821", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout


@pytest.mark.parametrize(
    ("page", "needle"),
    [
        ("tasks.md", "### Reading progress from outside (a progress bar)"),
        ("reference.md", 'run.steps.order_by("sequence")'),
        ("install.md", "pip builds the package inside the checkout"),
        ("install.md", '"django_dispatch": {"handlers": ["console"], "level": "INFO"}'),
    ],
)
def test_the_docs_answer_what_a_new_user_looked_for(page, needle):
    assert needle in (ROOT / "docs" / page).read_text()
