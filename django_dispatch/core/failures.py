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


#: Longest ``code`` attribute kept as a failure's code; a longer one is no
#: identifier (it is logged and stored unbounded otherwise): the class path is used.
CODE_MAX_LENGTH = 200


def error_code(exception: BaseException) -> str:
    """A failure's code: the exception's ``code`` attribute when it is a non-empty
    string (``ValidationError``, API clients' errors), else its class path.

    A stable thing to group, count and alert on, unlike a message that
    carries ids and values.
    """
    code = getattr(exception, "code", None)
    if isinstance(code, str) and 0 < len(code) <= CODE_MAX_LENGTH:
        return code
    cls = type(exception)
    return f"{cls.__module__}.{cls.__qualname__}"


def redacted_code(exception: BaseException, redactor: Callable[[str], str] | None) -> str:
    """``error_code``, through ``redactor`` when it is the exception's own ``code``
    (which may carry what the redactor is for); our class path needs none. A
    redactor that fails on it gives the class path: a code is never lost."""
    code = error_code(exception)
    cls = type(exception)
    path = f"{cls.__module__}.{cls.__qualname__}"
    if redactor is None or code == path:
        return code
    try:
        result = redactor(code)
    except Exception:
        return path
    return result if isinstance(result, str) and result else path


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
