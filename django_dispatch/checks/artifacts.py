"""Artifacts: the storage their files are saved to."""

from typing import Any

from django.conf import settings
from django.core import checks

from ..core.docs_links import docs_url


@checks.register()
def check_artifact_storage(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``DISPATCH["ARTIFACT_STORAGE"]``, when set, names a ``STORAGES`` alias (else every
    save fails). Left at its default, a site without ``STORAGES["default"]`` is not
    refused here: it may never save an artifact, and a save says what is missing."""
    raw = getattr(settings, "DISPATCH", None) or {}
    if not isinstance(raw, dict) or "ARTIFACT_STORAGE" not in raw:
        return []
    alias = raw["ARTIFACT_STORAGE"]
    known = list(getattr(settings, "STORAGES", None) or {})
    if isinstance(alias, str) and alias in known:
        return []
    return [
        checks.Error(
            f"DISPATCH['ARTIFACT_STORAGE'] is {alias!r}, which is not a key of STORAGES "
            f"({', '.join(map(repr, known)) or 'none'}).",
            hint="Add that alias to STORAGES or name one of its keys; see "
            f"{docs_url('artifacts', 'storage')}",
            id="django_dispatch.E050",
        )
    ]
