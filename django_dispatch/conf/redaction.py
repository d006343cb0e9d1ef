"""``DISPATCH["ERROR_REDACTOR"]``: checked, imported once per settings change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from . import generation, get_settings


def redactor_problems(path: Any) -> list[str]:
    if not isinstance(path, str):
        return [f"DISPATCH['ERROR_REDACTOR'] must be a dotted path (a string), got {path!r}."]
    if not path:
        return []
    try:
        redactor = import_string(path)
    except ImportError as e:
        return [
            f"DISPATCH['ERROR_REDACTOR'] is {path!r}, which cannot be imported ({e}). Give the "
            "dotted path of a function that takes a text and returns it redacted."
        ]
    if not callable(redactor):
        return [f"DISPATCH['ERROR_REDACTOR'] is {path!r}, which is not callable."]
    return []


_redactor: tuple[int, Callable[[str], str] | None] | None = None


def _raising(error: Exception) -> Callable[[str], str]:
    def redactor(text: str) -> str:
        raise error

    return redactor


def error_redactor() -> Callable[[str], str] | None:
    """``DISPATCH["ERROR_REDACTOR"]`` imported, None when unset; read once per
    settings change. One that cannot be imported gives a function that raises,
    so that ``core.failures.redacted`` stores its placeholder rather than the
    text (the system checks report the setting)."""
    global _redactor
    current = generation("DISPATCH")
    if _redactor is None or _redactor[0] != current:
        path = get_settings().ERROR_REDACTOR
        function: Callable[[str], str] | None = None
        if path:
            try:
                function = import_string(path)
            except ImportError as e:
                function = _raising(e)
        _redactor = (current, function)
    return _redactor[1]
