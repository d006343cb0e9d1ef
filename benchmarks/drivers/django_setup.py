"""Django start-up shared by the Django backends' drivers (and PgQueuer's ORM job)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent / "dispatch_project"


def configure(db_url: str, settings_module: str) -> None:
    """Configure Django for the benchmark project on ``db_url`` (no migrations)."""
    os.environ["DATABASE_URL"] = db_url
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    sys.path.insert(0, str(PROJECT_DIR))
    import django

    django.setup()


def setup(db_url: str, settings_module: str) -> None:
    """Configure Django for the benchmark project on ``db_url`` and migrate it."""
    configure(db_url, settings_module)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def manage_py() -> str:
    return str(PROJECT_DIR / "manage.py")
