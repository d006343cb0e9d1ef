"""``DISPATCH["ERROR_REDACTOR"]``: checked, imported once per settings change."""

from __future__ import annotations

from collections.abc import Callable

from .imported import imported


def error_redactor() -> Callable[[str], str] | None:
    """``DISPATCH["ERROR_REDACTOR"]`` imported, None when unset; read once per
    settings change. One that cannot be imported gives a function that raises,
    so that ``core.failures.redacted`` stores its placeholder rather than the
    text (the system checks report the setting)."""
    return imported("ERROR_REDACTOR")
