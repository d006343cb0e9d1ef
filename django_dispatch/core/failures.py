"""What a failure record says about an exception: its code, and its texts redacted.

Pure: the redactor comes in as an argument (``conf.error_redactor`` reads
``DISPATCH["ERROR_REDACTOR"]``); the store keeps what this returns.
"""

from __future__ import annotations

from collections.abc import Callable

#: Stored in place of a text whose redactor raised: keeping the text unredacted
#: could leak what the redactor exists to keep out, and dropping the failure
#: would lose it.
REDACTION_FAILED = "[not stored: DISPATCH['ERROR_REDACTOR'] raised {error} on this text]"


def error_code(exception: BaseException) -> str:
    """A failure's code: the exception's ``code`` attribute when it is a non-empty
    string (``ValidationError``, API clients' errors), else its class path.

    A stable thing to group, count and alert on, unlike a message that
    carries ids and values.
    """
    code = getattr(exception, "code", None)
    if isinstance(code, str) and code:
        return code
    cls = type(exception)
    return f"{cls.__module__}.{cls.__qualname__}"


def redacted(text: str, redactor: Callable[[str], str] | None) -> str:
    """``text`` as ``redactor`` returns it (unchanged without one).

    A redactor that raises, or returns something other than a string, must
    not crash the worker that records the failure, nor let the text through:
    ``REDACTION_FAILED`` is stored instead.
    """
    if redactor is None:
        return text
    try:
        result = redactor(text)
    except Exception as e:
        return REDACTION_FAILED.format(error=type(e).__name__)
    if not isinstance(result, str):
        return REDACTION_FAILED.format(error=f"no string (got {type(result).__name__})")
    return result
