"""``DISPATCH`` settings that name a function by its dotted path: checked, and
imported once per settings change (``ERROR_REDACTOR``, ``CALL_CONTEXT``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from . import generation, get_settings


def path_problems(name: str, path: Any, wanted: str) -> list[str]:
    """What is wrong with ``DISPATCH[name]``, a dotted path ("" for none) to
    ``wanted`` (how the function is called, for the message)."""
    if not isinstance(path, str):
        return [f"DISPATCH[{name!r}] must be a dotted path (a string), got {path!r}."]
    if not path:
        return []
    try:
        function = import_string(path)
    except ImportError as e:
        return [
            f"DISPATCH[{name!r}] is {path!r}, which cannot be imported ({e}). Give the "
            f"dotted path of {wanted}."
        ]
    if not callable(function):
        return [f"DISPATCH[{name!r}] is {path!r}, which is not callable."]
    return []


#: Setting name -> (settings generation, the function or None).
_imported: dict[str, tuple[int, Callable[..., Any] | None]] = {}


def _raising(error: Exception) -> Callable[..., Any]:
    def function(*args: Any) -> Any:
        raise error

    return function


def imported(name: str) -> Callable[..., Any] | None:
    """``DISPATCH[name]`` imported, None when unset; imported once per settings
    change. A path that cannot be imported gives a function that raises the
    ImportError when called: its callers decide what that failure means (the
    system checks report the setting itself)."""
    current = generation("DISPATCH")
    entry = _imported.get(name)
    if entry is None or entry[0] != current:
        path = getattr(get_settings(), name)
        function: Callable[..., Any] | None = None
        if path:
            try:
                function = import_string(path)
            except ImportError as e:
                function = _raising(e)
        entry = _imported[name] = (current, function)
    return entry[1]
