"""A job's call context: who or what enqueued it, as a JSON object.

Given per call (``task.using(call_context={...})``) or, when a call gives
none, by ``DISPATCH["CALL_CONTEXT"]``, a function called once per
``enqueue()`` (once per ``enqueue_many`` batch). It is per call, so it is
never part of a task's cached enqueue plan: it travels beside it to the
INSERT, one more parameter, and a call without one runs the statement an
enqueue always ran.
"""

from __future__ import annotations

from typing import Any

from ..compat import InvalidTask, Task
from ..conf.imported import imported
from ..exceptions import InvalidTaskArguments
from .values import encode_json

#: (JSON text, value after the JSON round trip), as ``store.enqueue`` takes it.
CallContext = tuple[str, Any]


def checked(value: Any, what: str = "call_context") -> CallContext:
    """``value`` as a call context, or InvalidTaskArguments saying what is wrong.

    A dict (a JSON object) whose JSON is at most ``DISPATCH["MAX_ARGS_BYTES"]``:
    it is stored on every job and read back by every attempt, so it is held
    to the arguments' bound.
    """
    if not isinstance(value, dict):
        raise InvalidTaskArguments(
            f"{what} must be a dict (a JSON object), got {type(value).__name__} {value!r}. "
            'Pass e.g. {"user": 42}. Nothing was enqueued.'
        )
    return encode_json(value, what, "MAX_ARGS_BYTES")


def for_call(task: Task) -> CallContext | None:
    """The call context of one enqueue of ``task``: its own (``using()``), else
    the ``DISPATCH["CALL_CONTEXT"]`` function's, else None.

    The function runs in the caller's code path: if it raises or returns
    something other than a dict or None, the enqueue fails with an
    InvalidTask naming the setting, and nothing is written (a job stored
    without the context its auditors expect would be silently wrong).
    """
    own = getattr(task, "call_context", None)
    if own is not None:
        return checked(own)  # validated by using(); encoded again for its text
    default = imported("CALL_CONTEXT")
    if default is None:
        return None
    what = "the value DISPATCH['CALL_CONTEXT'] returned"
    try:
        value = default()
    except Exception as e:
        raise InvalidTask(
            f"DISPATCH['CALL_CONTEXT'] raised {type(e).__name__}: {e}. It is called at "
            "every enqueue that sets no call_context; make it return a dict or None. "
            "Nothing was enqueued."
        ) from e
    if value is None:
        return None
    try:
        return checked(value, what)
    except InvalidTaskArguments as e:
        raise InvalidTask(f"{e} Fix DISPATCH['CALL_CONTEXT'].") from e
