"""What the system checks say: the exact text a user reads for each mistake.

A typo in a settings key must name the key that was meant (otherwise the
default silently applies), and every link in a message must go to a page and
section of the documentation site that exist, not to a path in the repository
that users of the installed package do not have.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.test import override_settings

import django_dispatch
from django_dispatch.checks import check_dispatch_settings
from django_dispatch.conf import closest, did_you_mean, known_keys
from django_dispatch.core.docs_links import DOCS_ROOT, PAGES, docs_url

SOURCE = Path(django_dispatch.__file__).parent
DOCS = SOURCE.parent / "docs"
SETTINGS_URL = "https://github.com/django-dispatch/django-dispatch/blob/main/docs/settings.md"
CRON_URL = "https://github.com/django-dispatch/django-dispatch/blob/main/docs/scheduling.md"
ADD = "tests.testapp.tasks.add"


def errors(dispatch: object, error_id: str) -> list[tuple[str, str | None]]:
    with override_settings(DISPATCH=dispatch):
        messages = check_dispatch_settings()
    return [(m.msg, m.hint) for m in messages if m.id == error_id]


# --- DISPATCH keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("LEASE_SECOND", "LEASE_SECONDS"),
        ("lease_seconds", "LEASE_SECONDS"),
        ("HEARTBEAT", "HEARTBEAT_INTERVAL"),
        ("MAX_ARG_BYTES", "MAX_ARGS_BYTES"),
        ("CRONS", "CRON"),
        ("RETENTION", "JOB_RETENTION"),
    ],
)
def test_an_unknown_dispatch_key_names_the_closest_known_key(key, meant):
    assert errors({key: 1}, "django_dispatch.E011") == [
        (
            f"DISPATCH has an unknown key {key!r}. Did you mean {meant!r}?",
            f"The keys django_dispatch reads are listed at {SETTINGS_URL}#dispatch",
        )
    ]


def test_an_unknown_key_like_no_known_key_gets_no_guess():
    assert errors({"COLOUR": "blue"}, "django_dispatch.E011") == [
        (
            "DISPATCH has an unknown key 'COLOUR'.",
            f"The keys django_dispatch reads are listed at {SETTINGS_URL}#dispatch",
        )
    ]


def test_each_unknown_key_is_its_own_error():
    texts = [
        msg for msg, _ in errors({"POLL_INTERVALL": 1, "LISTN": True, 3: 1}, "django_dispatch.E011")
    ]
    assert texts == [
        "DISPATCH has an unknown key 3.",
        "DISPATCH has an unknown key 'LISTN'. Did you mean 'LISTEN'?",
        "DISPATCH has an unknown key 'POLL_INTERVALL'. Did you mean 'POLL_INTERVAL'?",
    ]


def test_closest_ignores_case_and_refuses_far_guesses():
    assert closest("concurency", known_keys()) == "CONCURRENCY"
    assert closest("X", known_keys()) is None
    assert closest(42, known_keys()) is None
    assert did_you_mean("lastest", ("skip", "latest", "all")) == " Did you mean 'latest'?"
    assert did_you_mean("sometimes", ("skip", "latest", "all")) == ""


def test_dispatch_that_is_not_a_dict():
    assert errors(["LEASE_SECONDS"], "django_dispatch.E010") == [
        (
            "DISPATCH must be a dict, got list.",
            f"Every key is optional; see {SETTINGS_URL}#dispatch",
        )
    ]


def test_a_bad_value_points_to_the_validation_rules():
    assert errors({"PURGE_BATCH": 0}, "django_dispatch.E012") == [
        ("DISPATCH['PURGE_BATCH'] must be positive, got 0.", f"See {SETTINGS_URL}#validation"),
    ]


# --- DISPATCH["CRON"] entries --------------------------------------------------------------

CRON_HINT = f"See {CRON_URL}#declaring-entries-in-settings"
KEYS_HINT = (
    "An entry's keys are 'schedule', 'task', 'args', 'kwargs', 'timezone', 'queue_name', "
    f"'priority', 'misfire_policy', 'enabled', 'backend'. {CRON_HINT}"
)


def test_an_unknown_key_in_a_cron_entry_names_the_closest_known_key():
    entry = {"schedule": "0 3 * * *", "task": ADD, "timzone": "Europe/Paris", "priorty": 5}
    assert errors({"CRON": {"nightly": entry}}, "django_dispatch.E035") == [
        (
            "DISPATCH['CRON']['nightly'] has an unknown key 'priorty'. Did you mean 'priority'?",
            KEYS_HINT,
        ),
        (
            "DISPATCH['CRON']['nightly'] has an unknown key 'timzone'. Did you mean 'timezone'?",
            KEYS_HINT,
        ),
    ]


def test_a_misspelt_required_key_is_named_as_a_typo_and_as_missing():
    entry = {"shedule": "0 3 * * *", "task": ADD}
    assert errors({"CRON": {"nightly": entry}}, "django_dispatch.E035") == [
        (
            "DISPATCH['CRON']['nightly'] has an unknown key 'shedule'. Did you mean 'schedule'?",
            KEYS_HINT,
        )
    ]
    assert errors({"CRON": {"nightly": entry}}, "django_dispatch.E030") == [
        (
            "DISPATCH['CRON']['nightly'] must be a dict with at least 'schedule' and 'task'; "
            "'schedule' missing.",
            CRON_HINT,
        )
    ]
    assert errors({"CRON": {"nightly": "0 3 * * *"}}, "django_dispatch.E030") == [
        (
            "DISPATCH['CRON']['nightly'] must be a dict with at least 'schedule' and 'task', "
            "got str.",
            CRON_HINT,
        )
    ]


@pytest.mark.parametrize(
    ("schedule", "problem"),
    [
        ("61 * * * *", "minute field: 61 is out of range 0-59."),
        (
            "*/61 * * * *",
            "minute field: the step in '*/61' is larger than the field's range 0-59 "
            "(60 values), so it would match once per hour only (use a step from 1 to 60).",
        ),
        ("0 0 * * 8", "day-of-week field: 8 is out of range 0-7."),
    ],
)
def test_a_bad_schedule_names_the_field(schedule, problem):
    entry = {"schedule": schedule, "task": ADD}
    assert errors({"CRON": {"nightly": entry}}, "django_dispatch.E031") == [
        (
            f"DISPATCH['CRON']['nightly']: {schedule!r} is not a valid cron expression: {problem}",
            CRON_HINT,
        )
    ]


def test_a_misspelt_time_zone_gets_a_suggestion():
    entry = {"schedule": "0 3 * * *", "task": ADD, "timezone": "europe/paris"}
    [(msg, hint)] = errors({"CRON": {"nightly": entry}}, "django_dispatch.E031")
    assert msg.startswith(
        "DISPATCH['CRON']['nightly']: 'europe/paris' is not a known IANA time zone. "
        "Did you mean 'Europe/Paris'? "
    )
    assert hint == CRON_HINT


def test_a_misspelt_misfire_policy_gets_a_suggestion():
    entry = {"schedule": "0 3 * * *", "task": ADD, "misfire_policy": "lastest"}
    assert errors({"CRON": {"nightly": entry}}, "django_dispatch.E032") == [
        (
            "DISPATCH['CRON']['nightly']: misfire_policy 'lastest' is not one of "
            "['skip', 'latest', 'all']. Did you mean 'latest'?",
            f"See {CRON_URL}#missed-slots-misfire-policies",
        )
    ]


def test_a_valid_entry_has_no_errors():
    entry = {"schedule": "*/15 * * * *", "task": ADD, "timezone": "Europe/Paris"}
    with override_settings(DISPATCH={"CRON": {"nightly": entry}}):
        assert [m.id for m in check_dispatch_settings()] == []


# --- links to the documentation ------------------------------------------------------------


def test_docs_url_points_at_the_markdown_in_the_repository():
    """No documentation site exists before the first release: links go to the
    repository's docs/, the pyproject's Source URL, which exists."""
    source = re.search(r'^Source = "(.*)"$', (SOURCE.parent / "pyproject.toml").read_text(), re.M)
    assert source is not None
    assert f"{source.group(1)}/blob/main/docs/" == DOCS_ROOT
    assert docs_url("tasks", "timeouts") == f"{DOCS_ROOT}tasks.md#timeouts"
    assert docs_url("settings") == f"{DOCS_ROOT}settings.md"
    assert docs_url("index") == f"{DOCS_ROOT}index.md"
    assert docs_url("migrating/celery") == f"{DOCS_ROOT}migrating/celery.md"
    assert "readthedocs" not in (SOURCE / "compat.py").read_text()
    with pytest.raises(ValueError, match="'task' is not a documentation page"):
        docs_url("task", "timeouts")


def test_pages_are_the_files_under_docs():
    files = {
        str(path.relative_to(DOCS).with_suffix(""))
        for path in DOCS.rglob("*.md")
        if "_hooks" not in path.parts
    }
    assert files == PAGES


def _anchors(page: str) -> set[str]:
    """The GitHub-style slugs of a page's headings (the rule of docs/_hooks)."""
    text = (DOCS / f"{page}.md").read_text()
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # code blocks have no headings
    headings = re.findall(r"^#+\s+(.*?)\s*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _docs_url_calls() -> list[tuple[str, str, str]]:
    calls = []
    for path in SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "docs_url"
            ):
                values = [a.value for a in node.args if isinstance(a, ast.Constant)]
                assert len(values) == len(node.args), f"{path}: docs_url needs literal arguments"
                page, anchor = [*values, ""][:2]
                calls.append((str(path.relative_to(SOURCE)), page, anchor))
    return calls


def test_every_link_in_a_message_goes_to_an_existing_section():
    calls = _docs_url_calls()
    assert len(calls) >= 5  # the checks use it
    for where, page, anchor in calls:
        assert page in PAGES, (where, page)
        if anchor:
            assert anchor in _anchors(page), (where, page, anchor)


# --- TASKS[alias]["OPTIONS"] ---------------------------------------------------------------


def test_an_unknown_backend_option_names_the_closest_known_option():
    from django_dispatch.compat import task_backends

    tasks = {
        "default": {
            "BACKEND": "django_dispatch.backend.DispatchBackend",
            "QUEUES": [],
            "OPTIONS": {"MAX_ATTEMPT": 3, "backof": "x", "COLOUR": 1},
        }
    }
    with override_settings(TASKS=tasks):
        messages = task_backends["default"].check()
    assert [(m.id, m.msg, m.hint) for m in messages] == [
        (
            "django_dispatch.E002",
            f"TASKS['default']['OPTIONS'] has an unknown key {key!r}.{suggestion}",
            "Known options: ['BACKOFF', 'DATABASE', 'MAX_ATTEMPTS', 'NAMESPACE']. "
            f"See {SETTINGS_URL}#tasks",
        )
        for key, suggestion in [
            ("COLOUR", ""),
            ("MAX_ATTEMPT", " Did you mean 'MAX_ATTEMPTS'?"),
            ("backof", " Did you mean 'BACKOFF'?"),
        ]
    ]


def test_no_message_names_a_path_in_the_repository():
    """String literals (docstrings and comments aside) must not say "docs/x.md",
    except as part of the repository's address (``DOCS_ROOT``), which exists."""
    found = []
    for path in SOURCE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and re.search(r"docs/[\w/-]+\.md", node.value.replace(DOCS_ROOT, ""))
            ):
                found.append(f"{path.relative_to(SOURCE)}:{node.lineno}: {node.value!r}")
    assert found == []
