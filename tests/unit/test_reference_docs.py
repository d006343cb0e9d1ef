"""docs/reference.md and docs/settings.md cannot drift from the code: every
``DISPATCH`` key that conf.py reads, every system check id the package can
report and every public name of the package's face is documented, and no
documented key or check id is one the code does not have."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import django_dispatch
from django_dispatch.conf import known_keys

SOURCE = Path(django_dispatch.__file__).parent
DOCS = SOURCE.parent / "docs"
REFERENCE = (DOCS / "reference.md").read_text()
SETTINGS = (DOCS / "settings.md").read_text()

#: The public modules: their ``__all__`` is the API (``task`` and the
#: exceptions are the root's; the rest are internal layers).
FACES = [
    "django_dispatch",
    "django_dispatch.jobs",
    "django_dispatch.dead_letters",
    "django_dispatch.schedules",
    "django_dispatch.events",
    "django_dispatch.usage",
    "django_dispatch.artifacts",
    "django_dispatch.flow",
    "django_dispatch.testing",
    "django_dispatch.services",
    "django_dispatch.workflows",
]


def _table_keys(text: str) -> set[str]:
    """The names in the first column of Markdown tables: | `NAME` | ..."""
    return set(re.findall(r"^\| `([A-Z][A-Z_]+)` \|", text, flags=re.M))


def _check_ids_in_code() -> set[str]:
    ids = set()
    for path in SOURCE.rglob("*.py"):
        text = path.read_text()
        ids |= {f"django_dispatch.{i}" for i in re.findall(r"django_dispatch\.([EW]\d{3})", text)}
        ids |= {f"django_dispatch.{i}" for i in re.findall(r"\"([EW]\d{3})\"", text)}
    return ids


def test_every_dispatch_key_is_in_the_reference_and_the_settings_page():
    keys = set(known_keys())
    assert keys - _table_keys(REFERENCE) == set(), "missing from docs/reference.md"
    assert keys - _table_keys(SETTINGS) == set(), "missing from docs/settings.md"


def test_no_documented_dispatch_key_is_unknown_to_the_code():
    tasks_options = {"BACKEND", "QUEUES", "OPTIONS", "MAX_ATTEMPTS", "BACKOFF", "NAMESPACE"}
    for page, text in (("reference", REFERENCE), ("settings", SETTINGS)):
        unknown = _table_keys(text) - set(known_keys()) - tasks_options
        assert unknown == set(), f"docs/{page}.md documents keys the code does not read"


def test_every_check_id_is_documented_and_no_documented_id_is_stale():
    in_code = _check_ids_in_code()
    assert len(in_code) >= 20
    for page, text in (("reference", REFERENCE), ("settings", SETTINGS)):
        documented = set(re.findall(r"django_dispatch\.[EW]\d{3}", text))
        assert in_code - documented == set(), f"missing from docs/{page}.md"
        assert documented - in_code == set(), f"docs/{page}.md lists ids the code lacks"


@pytest.mark.parametrize("face", FACES)
def test_every_public_name_is_in_the_reference(face):
    module = importlib.import_module(face)
    short = face.removeprefix("django_dispatch").lstrip(".")
    missing = [
        name
        for name in module.__all__
        if not name.startswith("_")
        and f"`{name}" not in REFERENCE
        and f"{short}.{name}" not in REFERENCE
        and f" {name}(" not in REFERENCE
        and f"\n{name}(" not in REFERENCE
    ]
    assert missing == [], f"{face}: not in docs/reference.md"


def test_nothing_is_marked_planned_any_more():
    assert "planned" not in REFERENCE.lower()
    assert "planned" not in SETTINGS.lower()
