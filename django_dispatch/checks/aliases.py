"""The ``TASKS`` aliases served by a DispatchBackend, as the setting declares them."""

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string


def dispatch_backend_options() -> dict[str, dict[str, Any]]:
    """``TASKS`` aliases whose BACKEND is a DispatchBackend: alias -> OPTIONS.

    Read from the setting, not from built backends, so that a bad option is
    reported by the check rather than raised while building the backend.
    """
    from ..tasks.registry import DispatchBackendBase

    found: dict[str, dict[str, Any]] = {}
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            cls = import_string(params.get("BACKEND", ""))
        except (ImportError, AttributeError, TypeError):
            continue
        if isinstance(cls, type) and issubclass(cls, DispatchBackendBase):
            options = params.get("OPTIONS") or {}
            found[alias] = options if isinstance(options, dict) else {}
    return found
