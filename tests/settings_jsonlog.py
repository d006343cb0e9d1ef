"""The test settings, logging django_dispatch as JSON lines (the documented example).

Worker subprocesses started with ``DJANGO_SETTINGS_MODULE=tests.settings_jsonlog``
write one JSON object per record, so a test reads the ``dispatch_*`` fields
a real process put on its records.
"""

from tests.settings import *  # noqa: F403

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "django_dispatch.observability.logs.JSONFormatter"}},
    "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json"}},
    "loggers": {"django_dispatch": {"handlers": ["json"], "level": "INFO"}},
}
