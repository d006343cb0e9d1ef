"""Strict JSON: what arguments, results, checkpoints and outputs are stored as.

Every value a job stores goes through here on its way in: encoded once
(``allow_nan=False``, ``ensure_ascii``), checked storable by every database
(no NUL, no unpaired surrogate), measured against its size limit (by
``tasks.values``, which knows the settings) on the text itself, then
decoded, so that the caller keeps the value the worker will see (tuples
become lists).

What Django's own backends accept beyond JSON's types is accepted the same
way, through Django's ``normalize_json``: ``bytes`` decoded as UTF-8, any
``Mapping`` or ``Sequence`` (a ``range``, a ``deque``...). That second pass
runs only when the first, plain one fails, so common calls pay nothing for
it. NaN and infinity, which Django's in-process backends pass through, are
refused: they are not JSON, and no database column stores them as such.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..compat import normalize_json
from ..exceptions import InvalidTaskArguments, InvalidTaskArgumentValue

#: What ``json.dumps(value, allow_nan=False)`` and ``json.loads(text)`` use,
#: made once: ``json.dumps`` builds a new encoder per call when given options.
JSON_ENCODER = json.JSONEncoder(allow_nan=False)
JSON_DECODER = json.JSONDecoder()


def dumps(value: Any) -> str:
    """The strict JSON text of ``value``, as Django's backends would normalize it.

    JSON's own types go through the C encoder in one pass. Only when that
    fails is ``value`` normalized as Django's backends do (``normalize_json``:
    bytes decoded as UTF-8, other mappings and sequences as dicts and lists)
    and encoded again; a value Django refuses raises what Django raises
    (``TypeError``, or ``ValueError`` for bytes that are not UTF-8). NaN and
    infinity raise ``ValueError``: they are not JSON.
    """
    try:
        return JSON_ENCODER.encode(value)
    except TypeError as e:
        try:
            normalized = normalize_json(value)
        except TypeError:
            raise e from None  # the encoder's message names the type as clearly
    return JSON_ENCODER.encode(normalized)


def json_text(value: Any, what: str) -> str:
    """The strict JSON text of ``value``, storable by any database, or InvalidTaskArguments.

    ``InvalidTaskArguments`` (a ``TypeError``) for a value of a type JSON
    has no place for, as Django's backends raise ``TypeError``; its subclass
    ``InvalidTaskArgumentValue``, also a ``ValueError``, for a value of a
    JSON type that cannot be stored (see ``dumps``, ``check_storable_json``).
    """
    try:
        text = dumps(value)
        check_storable_json(text)
    except TypeError as e:
        raise InvalidTaskArguments(
            f"{what} must be JSON-serializable ({e}). Pass ids and plain data "
            "(str, int, float, bool, None, lists, dicts with str keys), not objects."
        ) from e
    except ValueError as e:
        cause = e.__cause__ or e.__context__  # normalize_json's own, or its context
        if isinstance(cause, UnicodeDecodeError):
            detail = f"bytes that are not UTF-8 text: {cause}"
            advice = "Pass text, or encode binary data first (e.g. base64)."
        else:
            detail = str(e)
            advice = "Pass finite numbers and text without NUL characters."
        raise InvalidTaskArgumentValue(
            f"{what} must be JSON-serializable ({detail}). {advice}"
        ) from e
    return text


#: ``\u0000`` as an escape, not as the text of an escaped backslash (``\\u0000``).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_storable_json(text: str) -> None:
    """ValueError if JSON text holds what a JSON column cannot store.

    PostgreSQL's jsonb refuses the NUL character and unpaired UTF-16
    surrogates. Caught here, a task's bad argument is a clear error at
    enqueue, and a bad return value fails its job (not retried) instead of
    failing the whole wave of completions it was written with. ``text`` is
    ASCII (``ensure_ascii``): both show up as ``\\u`` escapes, so the common
    case is two substring searches.
    """
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise ValueError("it contains a NUL character (\\u0000), which databases cannot store")
    if "\\ud" in text or "\\uD" in text:
        try:
            json.dumps(JSON_DECODER.decode(text), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                "it contains an unpaired UTF-16 surrogate, which databases cannot store"
            ) from None
