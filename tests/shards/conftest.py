"""An alias ``eu`` whose rows live in a database of their own, ``jobs_eu``.

``tests/settings.py`` defines ``DATABASES["jobs_eu"]`` on the PostgreSQL tier
only (the same server, a second database); no alias uses it outside these
tests. SQLite runs the checks' tests, and skips those needing two databases.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings

from tests.conftest import TEST_DB

EU_DB = "jobs_eu"
BACKEND = "django_dispatch.backend.DispatchBackend"
BACKOFF = "tests.testapp.tasks.quick_backoff"

#: ``eu`` beside the test settings' ``default`` (namespace "", the default database).
EU_ALIAS = {
    "BACKEND": BACKEND,
    "QUEUES": [],
    "OPTIONS": {"BACKOFF": BACKOFF, "NAMESPACE": "eu", "DATABASE": EU_DB},
}

two_databases = pytest.mark.skipif(
    TEST_DB != "postgres" or EU_DB not in settings.DATABASES,
    reason="needs the PostgreSQL tier's second database (jobs_eu)",
)


def tasks_with_eu() -> dict:
    return {**settings.TASKS, "eu": EU_ALIAS}


@pytest.fixture
def eu_alias() -> Iterator[None]:
    with override_settings(TASKS=tasks_with_eu()):
        yield


def worker_env() -> dict[str, str]:
    """What a worker subprocess needs to serve ``eu``: the alias, and the name of
    the test database pytest-django created for ``jobs_eu``."""
    return {
        "DISPATCH_TASKS_OVERRIDES": json.dumps({"eu": EU_ALIAS}),
        "DISPATCH_DB_EU_NAME": str(connections[EU_DB].settings_dict["NAME"]),
    }
