"""Settings for the django_dispatch example project.

SQLite (``db.sqlite3`` next to ``manage.py``) by default, so the demo needs no
server. Set ``DATABASE_URL=postgres://user:password@host:5432/name`` to run it
on PostgreSQL instead.
"""

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent

# Development settings: never deploy with this key or with DEBUG on.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-example-project-only")
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_dispatch",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def database_from_url(url: str) -> dict:
    """A DATABASES entry from ``postgres://user:password@host:port/name``."""
    parts = urlparse(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ValueError(f"DATABASE_URL must start with postgres://, got {parts.scheme!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "db.sqlite3",
            # WAL lets the worker's threads read while another one writes;
            # the timeout makes writers wait for SQLite's single write lock
            # instead of failing with "database is locked".
            "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL;", "timeout": 20},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's Tasks framework, pointed at django_dispatch.
TASKS = {
    "default": {
        "BACKEND": "django_dispatch.backend.DispatchBackend",
        "QUEUES": [],  # [] accepts any queue name
        "OPTIONS": {
            # Attempts for tasks that do not set max_attempts themselves.
            "MAX_ATTEMPTS": 3,
        },
    }
}

# django_dispatch's own settings. Every key is optional; these are the
# defaults (see docs/settings.md for the full list).
DISPATCH = {
    # Job threads per worker process (`rundispatch --concurrency`).
    "CONCURRENCY": 4,
    # Seconds between polls for new or due jobs when no wake-up arrives
    # (always the case on SQLite).
    "POLL_INTERVAL": 1.0,
    # Seconds a running job's lease lasts without renewal: how long a job
    # of a killed worker waits before another worker takes it over.
    "LEASE_SECONDS": 30.0,
    # Periodic jobs, synced into the CronEntry table when a worker starts
    # (also editable in the admin). Fires once per slot across all workers.
    "CRON": {
        "nightly-report": {
            "schedule": "0 3 * * *",
            "task": "shop.tasks.nightly_report",
            "timezone": "Europe/Paris",
        },
    },
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Where STORAGES["default"] (FileSystemStorage) keeps files: the demo's
# artifacts (shop.tasks.export_deliveries) land under media/dispatch/.
MEDIA_ROOT = BASE_DIR / "media"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "simple": {"format": "{asctime} {levelname} {name}: {message}", "style": "{"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "simple"},
    },
    "loggers": {
        "django_dispatch": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
