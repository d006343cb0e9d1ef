"""The values a job stores, encoded as strict JSON and bounded by the size settings.

``core.encoding`` knows JSON and ``core.limits`` knows sizes, neither reads
a setting; this is where the two meet ``DISPATCH``'s ``MAX_*_BYTES``, so
that every value on its way into a row (a return value, a checkpoint, an
event's payload, a replay's arguments) is measured the same way.
"""

from __future__ import annotations

from typing import Any

from ..conf import size_limit
from ..core.encoding import JSON_DECODER, json_text
from ..core.limits import check_size


def encode_json(value: Any, what: str, limit: str | None = None) -> tuple[str, Any]:
    """(JSON text of ``value``, ``value`` after a strict JSON round trip), or InvalidTaskArguments.

    The round trip is what the worker will see (tuples become lists), so the
    TaskResult returned at enqueue equals the one read back later. ``limit``
    names the ``DISPATCH`` setting bounding the text's size (see
    ``core.limits``); it is checked before the text is decoded.
    """
    text = json_text(value, what)
    if limit is not None:
        check_size(len(text), what, limit, size_limit(limit))
    return text, JSON_DECODER.decode(text)


def to_json(value: Any, what: str, limit: str | None = "MAX_RESULT_BYTES") -> Any:
    """``value`` after a strict JSON round trip, or InvalidTaskArguments (see ``encode_json``).

    Bounded by ``DISPATCH["MAX_RESULT_BYTES"]`` unless ``limit`` names
    another size limit: the executor stores a task's return value through
    here, so a value too big to store fails its job (not retried: the same
    code would return it again) before anything is written. ``None`` (what
    most tasks return) is its own round trip: only its size is checked.
    """
    if value is None:
        if limit is not None:
            check_size(4, what, limit, size_limit(limit))  # len("null")
        return None
    return encode_json(value, what, limit)[1]
