"""The ``DISPATCH`` setting: its shape, its keys, their values, and the jobs' database."""

from typing import Any

from django.conf import settings
from django.core import checks

from ..conf import did_you_mean, get_settings, known_keys, unknown_keys
from ..core.docs_links import docs_url
from .cron_entries import check_cron_entries
from .database import check_jobs_database


@checks.register()
def check_dispatch_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    raw = getattr(settings, "DISPATCH", None) or {}
    if not isinstance(raw, dict):
        return [
            checks.Error(
                f"DISPATCH must be a dict, got {type(raw).__name__}.",
                hint=f"Every key is optional; see {docs_url('settings', 'dispatch')}",
                id="django_dispatch.E010",
            )
        ]
    messages = _check_keys(raw) + _check_values()
    cron_entries = raw.get("CRON", {})
    if isinstance(cron_entries, dict):
        messages += check_cron_entries(cron_entries)
    return messages + check_jobs_database()


def _check_keys(raw: dict[Any, Any]) -> list[checks.CheckMessage]:
    """One error per unknown key, each with its own suggestion: a typo is
    otherwise silently ignored and the default applies."""
    known = known_keys()
    return [
        checks.Error(
            f"DISPATCH has an unknown key {key!r}.{did_you_mean(key, known)}",
            hint=f"The keys django_dispatch reads are listed at {docs_url('settings', 'dispatch')}",
            id="django_dispatch.E011",
        )
        for key in unknown_keys(raw)
    ]


def _check_values() -> list[checks.CheckMessage]:
    try:
        problems = get_settings().validate()
    except TypeError as e:
        problems = [f"DISPATCH has a value of the wrong type: {e}"]
    return [
        checks.Error(p, hint=f"See {docs_url('settings', 'validation')}", id="django_dispatch.E012")
        for p in problems
    ]
