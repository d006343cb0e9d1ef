"""Suggestions for misspelt names: a typo in a settings key is otherwise silently
ignored (the default applies), so every "unknown key" message names the
nearest known one. Pure."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: object, known: Iterable[str]) -> str | None:
    """The name in ``known`` that a misspelt ``word`` most likely meant, or None.

    A typo in a settings key is otherwise silently ignored (the default
    applies), so every "unknown key" message names the nearest known key.
    Case is ignored (``lease_seconds`` finds ``LEASE_SECONDS``); below
    difflib's usual similarity of 0.6 nothing is suggested, since a wrong
    guess misleads more than none.
    """
    if not isinstance(word, str):
        return None
    folded = {name.casefold(): name for name in known}
    matches = difflib.get_close_matches(word.casefold(), list(folded), n=1, cutoff=0.6)
    return folded[matches[0]] if matches else None


def did_you_mean(word: object, known: Iterable[str]) -> str:
    """``" Did you mean 'X'?"`` for the nearest known name, or ``""``: appended to a message."""
    match = closest(word, known)
    return f" Did you mean {match!r}?" if match else ""
