"""The benchmark project with Django's admin: the history check times the admin's
job list and the operations console next to millions of finished jobs.

``BENCH_NO_PURGE=1`` (the worker of the purge check): its leader keeps every
job, so that the only purge running is the one the check starts and times;
``BENCH_PURGE_PAUSE``: that purge's ``PURGE_PAUSE``.
"""

import os

from .settings import *  # noqa: F403
from .settings import DISPATCH, INSTALLED_APPS

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    *INSTALLED_APPS,
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "benchproject.urls_history"
ALLOWED_HOSTS = ["testserver"]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("BENCH_NO_PURGE"):
    DISPATCH = {
        **DISPATCH,
        "JOB_RETENTION": {"succeeded": None, "failed": None, "cancelled": None},
        "DEAD_LETTER_RETENTION": 1e10,
    }

if os.environ.get("BENCH_PURGE_PAUSE"):
    DISPATCH = {**DISPATCH, "PURGE_PAUSE": float(os.environ["BENCH_PURGE_PAUSE"])}
