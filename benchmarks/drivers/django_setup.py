"""Django start-up shared by the two Django backends' drivers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent / "dispatch_project"


def setup(db_url: str, settings_module: str) -> None:
    """Configure Django for the benchmark project on ``db_url`` and migrate it."""
    os.environ["DATABASE_URL"] = db_url
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    sys.path.insert(0, str(PROJECT_DIR))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def manage_py() -> str:
    return str(PROJECT_DIR / "manage.py")
