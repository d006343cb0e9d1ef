"""Size limits that protect the database from values no job should store.

Arguments, return values and checkpoints are measured on the JSON text that
is about to be stored, which the caller has already encoded, so a check is a
``len()`` and a comparison. That text is ASCII (``ensure_ascii``): its length
is its size in bytes, a non-ASCII character counting as its ``\\uXXXX``
escape. Values over their limit are refused with ``InvalidTaskArguments``
naming the size, the limit and the setting that raises it. Errors are
never refused: an attempt's error message and traceback are cut to
``MAX_ERROR_BYTES`` each, keeping both ends (the exception is at the end of
a traceback, the call that led to it at the start).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..exceptions import InvalidTaskArguments

#: What to do instead of storing big values, per limit.
_ADVICE = {
    "MAX_ARGS_BYTES": (
        "Pass ids or references (a primary key, a file's storage name) and load the data "
        "in the task"
    ),
    "MAX_RESULT_BYTES": (
        "Store large results elsewhere (a model, a file in Django's storage) and "
        "return a reference to them"
    ),
    "MAX_CHECKPOINT_BYTES": (
        "Save a small resume cursor (an offset, the last id done), not the data itself"
    ),
}


class JSONTooLarge(InvalidTaskArguments):
    """A value's JSON is over its size limit.

    An ``InvalidTaskArguments`` (catch that), hence a ``TypeError``.
    ``enqueue_many`` relies on the latter: it answers a ``TypeError`` from
    building its chunks by checking the calls one by one, which names the
    first bad call (``call #i: …``). The class of its own tells a retry
    policy that the next attempt would be just as big (see
    ``tasks.enqueue.DispatchBackendBase.backoff_for``).
    """


#: Its documented path, which is also what a failed job's stored error names
#: (``exception_class_path``): the class is defined here, read from there.
JSONTooLarge.__module__ = "django_dispatch.limits"


def too_large(what: str, size: int, setting: str, limit: int) -> JSONTooLarge:
    """The error for ``what``: ``size`` bytes of JSON, over ``limit`` (``DISPATCH[setting]``)."""
    return JSONTooLarge(
        f"{what}: {size:,} bytes of JSON, over the limit of {limit:,} bytes "
        f"(DISPATCH['{setting}']). {_ADVICE[setting]}, or raise DISPATCH['{setting}']."
    )


def check_size(size: int, what: str, setting: str, limit: int) -> None:
    """Raise ``too_large`` when ``size`` exceeds ``limit``, the value of ``DISPATCH[setting]``."""
    if size > limit:
        raise too_large(what, size, setting, limit)


#: Where one call ends and the next begins in ``JSON_ENCODER.encode(pairs)``
#: of ``[args, kwargs]`` pairs: the end of a kwargs object and of its pair,
#: the separator, the start of the next pair and of its args array.
_CALL_BOUNDARY = "}], [["


def call_sizes(text: str, calls: Sequence[Sequence[Any]]) -> list[int]:
    """The JSON size of each call's args plus kwargs, from ``text``, their pairs' JSON.

    ``text`` is ``[[args, kwargs], [args, kwargs], …]`` as the default
    encoder writes it, so every boundary between two calls reads
    ``}], [[``, and splitting there leaves each call's ``args, kwargs``
    (less the brackets and separators removed, added back below) at C
    speed. The same six characters may also occur inside a string; then
    there are more pieces than calls, and each call is encoded again on its
    own instead (exact, slower, rare).
    """
    pieces = text.split(_CALL_BOUNDARY)
    if len(pieces) != len(calls):
        return [json_size(args) + json_size(kwargs) for args, kwargs in calls]
    sizes = [len(piece) for piece in pieces]
    # Interior pieces are "<args less its '['>, <kwargs less its '}'>": their
    # length is len(args) + len(kwargs). The first piece also holds the
    # chunk's "[" and its pair's "[" but not the trailing "}]"; the last one
    # holds "]]" at the end.
    if len(sizes) == 1:
        sizes[0] -= 6  # "[[" + args + ", " + kwargs + "]]"
    else:
        sizes[0] -= 3
        sizes[-1] -= 3
    return sizes


def json_size(value: Any) -> int:
    """The length of ``value``'s JSON as ``encoding.JSON_ENCODER`` writes it."""
    return len(_ENCODER.encode(value))


_ENCODER = json.JSONEncoder()  # the same text as encoding.JSON_ENCODER for valid JSON


def truncate_error_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` (``MAX_ERROR_BYTES``) bytes of UTF-8, its start and end kept.

    Unpaired surrogates (which no database stores) become ``?``, and NUL
    characters (which PostgreSQL's jsonb refuses) ``\\x00``, so that a
    strange exception message can never make its job's completion fail.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if text.isascii() and len(text) <= limit:
        return text
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return data.decode("utf-8")
    marker = f"\n[... {{}} bytes cut: DISPATCH['MAX_ERROR_BYTES'] is {limit:,} ...]\n"
    room = max(0, limit - len(marker.format(f"{len(data):,}")))
    head, tail = room // 2, room - room // 2
    cut = len(data) - head - tail
    return (
        data[:head].decode("utf-8", "ignore")
        + marker.format(f"{cut:,}")
        + data[len(data) - tail :].decode("utf-8", "ignore")
    )
