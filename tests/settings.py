"""Settings for the test suite.

``DISPATCH_TEST_DB`` picks the database:

- ``postgres`` (default): PostgreSQL at ``DATABASE_URL`` (``scripts/with-postgres``
  starts a throwaway one);
- ``pgbouncer``: the same server through PgBouncer in transaction mode at
  ``PGBOUNCER_URL`` (also started by ``scripts/with-postgres``), with LISTEN off;
- ``chaos``: servers the chaos suite starts, crashes and restarts itself
  (tests/chaos/servers.py points this connection at them);
- ``sqlite``: a SQLite file.

Worker subprocesses started by tests get ``DISPATCH_DB_NAME`` so that they use
the test database pytest-django created (and ``DISPATCH_DB_EU_NAME`` for the
second PostgreSQL database, ``jobs_eu``, of tests/shards/).
"""

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_dispatch",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
# Artifacts saved through STORAGES["default"] (worker subprocesses get the test's directory).
MEDIA_ROOT = os.environ.get("DISPATCH_TEST_MEDIA_ROOT", str(BASE_DIR / ".media"))
STATIC_URL = "/static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

ENGINE = os.environ.get("DISPATCH_TEST_DB", "postgres")
# One test database per test run, so that two runs at once (two engineers, or
# an editor's runner next to `make test`) never share or drop each other's
# database. Worker subprocesses inherit the id, and get their database's name
# from DISPATCH_DB_NAME anyway.
RUN_ID = os.environ.setdefault("DISPATCH_TEST_RUN", str(os.getpid()))
if ENGINE == "sqlite":
    sqlite_dir = BASE_DIR / ".sqlite"
    sqlite_dir.mkdir(exist_ok=True)
    DATABASES: dict[str, dict[str, Any]] = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("DISPATCH_DB_NAME", str(sqlite_dir / "dispatch.sqlite3")),
            "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL;", "timeout": 20},
            "TEST": {"NAME": str(sqlite_dir / f"test_dispatch_{RUN_ID}.sqlite3")},
        }
    }
else:
    # ``pgbouncer``: through PgBouncer in transaction mode (scripts/with-postgres
    # starts one and sets PGBOUNCER_URL), configured as a site behind such a
    # pooler must be (docs/deployment.md#pgbouncer).
    url_variable = "PGBOUNCER_URL" if ENGINE == "pgbouncer" else "DATABASE_URL"
    url = os.environ.get(url_variable)
    if ENGINE == "chaos":  # set by tests/chaos/conftest.py once its server runs
        url = "postgres://postgres@chaos-server-not-started.invalid/postgres"
    if not url:
        raise RuntimeError(
            f"{url_variable} is not set. Run the tests with `make test` (scripts/with-postgres "
            "starts a throwaway PostgreSQL and a PgBouncer in front of it), or set "
            "DISPATCH_TEST_DB=sqlite."
        )
    parts = urlparse(url)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("DISPATCH_DB_NAME", unquote(parts.path.lstrip("/"))),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "TEST": {"NAME": f"test_dispatch_{RUN_ID}"},
        }
    }
    if ENGINE == "postgres":
        # A second database on the same server, for the aliases that keep their
        # rows in a database of their own (tests/shards/). pytest-django creates
        # its test database only for the tests that ask for it
        # (``django_db(databases=[..., "jobs_eu"])``); no TASKS alias uses it
        # unless a test says so, so every other test sees what it always did.
        DATABASES["jobs_eu"] = {
            **DATABASES["default"],
            "NAME": os.environ.get("DISPATCH_DB_EU_NAME", "dispatch_jobs_eu"),
            "TEST": {"NAME": f"test_dispatch_eu_{RUN_ID}"},
        }
    if ENGINE == "pgbouncer":
        # A WITH HOLD cursor opened by .iterator() outside a transaction would
        # be fetched from on another server session. Prepared statements stay
        # off as Django leaves them (OPTIONS["prepare_threshold"] = None): the
        # PgBouncer 1.18 of Debian 12 cannot track them in transaction mode.
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True

TASKS = {
    "default": {
        "BACKEND": "django_dispatch.backend.DispatchBackend",
        "QUEUES": [],
        "OPTIONS": {"BACKOFF": "tests.testapp.tasks.quick_backoff"},
    }
}
# Worker subprocesses started by a test may get more aliases (namespaces tests).
TASKS.update(json.loads(os.environ.get("DISPATCH_TASKS_OVERRIDES", "{}")))

# Short leases and intervals so that crash and shutdown tests take seconds.
DISPATCH = {
    "LEASE_SECONDS": 2.0,
    "HEARTBEAT_INTERVAL": 0.3,
    "RECLAIM_INTERVAL": 0.5,
    "POLL_INTERVAL": 0.1,
    "SHUTDOWN_TIMEOUT": 5.0,
}
if ENGINE == "pgbouncer":
    DISPATCH["LISTEN"] = False  # LISTEN needs a session of its own
# Worker subprocesses started by a test may get different values.
DISPATCH.update(json.loads(os.environ.get("DISPATCH_OVERRIDES", "{}")))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_dispatch": {"handlers": ["console"], "level": "INFO"}},
}
