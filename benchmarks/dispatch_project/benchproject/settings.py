"""The benchmark's Django project on django_dispatch, production-like.

The database comes from ``DATABASE_URL`` (PostgreSQL only). ``DISPATCH`` is
left at its defaults: leases, heartbeats and polling are what users get;
with ``BENCH_POOLER=1`` (the workers behind PgBouncer), LISTEN is off.
"""

import os
from urllib.parse import unquote, urlparse

SECRET_KEY = "benchmark-only"
DEBUG = False  # DEBUG keeps every query in memory: never measure with it
USE_TZ = True
ALLOWED_HOSTS: list[str] = []

INSTALLED_APPS = ["django_dispatch", "bench"]

_url = urlparse(os.environ["DATABASE_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_url.path.lstrip("/")),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
        "CONN_MAX_AGE": 600,
    }
}

TASKS = {
    "default": {
        "BACKEND": "django_dispatch.backend.DispatchBackend",
        "QUEUES": [],
        "OPTIONS": {},
    }
}
DISPATCH: dict = {}

if os.environ.get("BENCH_DISPATCH"):  # experiments: DISPATCH settings as JSON
    import json

    DISPATCH.update(json.loads(os.environ["BENCH_DISPATCH"]))

if os.environ.get("BENCH_PREPARE"):
    # psycopg prepares a statement after 5 runs; only server-bound ones (the
    # worker's claim and finish), since Django's own cursor binds on the client.
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5

if os.environ.get("BENCH_POOLER"):
    # Behind PgBouncer in transaction mode, configured as docs/deployment.md says.
    DISPATCH["LISTEN"] = False
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True

# Warnings and errors only: no system in the benchmark logs every job. The
# "django.tasks" logger is named because Django's default logging sets the
# "django" logger to INFO, which the root level does not override: Django's
# own task-signal receivers would build two INFO records per job (dropped by
# the handler, but built), about 10% of a no-op drain (docs/worker.md
# "Logging"). Both Django systems here (django_dispatch, django-tasks-db) run
# with this project's settings.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {"django.tasks": {"level": "WARNING"}},
}
