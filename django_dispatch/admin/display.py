"""How the console shows times, durations and states, as HTML for the admin's columns and tags.

Times are shown relative ("3 s ago") because during an incident the
question is "how long", not "when"; the exact time stays on hover (the
``title``), and ``static/django_dispatch/console.js`` keeps the relative text
ticking between refreshes from ``data-age`` (seconds, measured on the
server's clock, so a skewed browser clock does not distort it).
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from html import escape
from typing import Any

from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.text import Truncator

#: What is the same for every row of the page being rendered (the active time
#: zone, a translated label), by key: ``one_page`` holds it while a change
#: list's rows are rendered. Django keeps the active time zone and language in
#: context-locals (asgiref's ``Local``), and reading one per cell cost more than
#: the rest of a relative time's cell; a ``ContextVar`` keeps each page's apart,
#: as those do, across threads and async tasks.
_PAGE: ContextVar[dict[Any, Any] | None] = ContextVar("dispatch_page", default=None)
#: ``per_page``'s key of the page's "now" (``page_now``).
NOW = object()


@contextmanager
def one_page() -> Iterator[None]:
    """Keep ``per_page``'s values for the rows rendered inside: one page's."""
    token = _PAGE.set({})
    try:
        yield
    finally:
        _PAGE.reset(token)


def per_page[T](key: Any, make: Callable[[], T]) -> T:
    """``make()``, made once per page inside ``one_page`` (each call outside it)."""
    page = _PAGE.get()
    if page is None:
        return make()
    try:
        return page[key]  # type: ignore[no-any-return]
    except KeyError:
        value = page[key] = make()
        return value


def page_now() -> datetime:
    """``timezone.now()``, taken once per page inside ``one_page``.

    Every relative time and running duration of a page is then measured
    from the same instant (a page's rows agree with each other), and a row
    reads the clock once, not once per cell."""
    return per_page(NOW, timezone.now)


def html(value: Any) -> str:
    """Django's ``conditional_escape``: safe text kept, anything else escaped.

    Without its lazy-text wrapper, which costs more than the escaping: a
    change list escapes a few thousand values a page, most of them names
    and numbers with nothing to escape, which five ``in`` tests tell apart
    at a fraction of ``escape``'s five ``replace`` calls."""
    if hasattr(value, "__html__"):
        return value.__html__()
    text = str(value)
    if "&" in text or "<" in text or ">" in text or '"' in text or "'" in text:
        return escape(text)
    return text


def format_safe(template: str, *args: Any) -> SafeString:
    """``format_html`` (the same output) for the columns a change list renders per row."""
    return SafeString(template.format(*[html(a) for a in args]))


def human_seconds(seconds: float | None) -> str:
    """``850 ms``, ``12.3 s``, ``4 min 2 s``, ``3 h 5 min``, ``2 d 4 h``; "-" for None."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


#: Ages closer to zero than this read "just now": the database's clock (which
#: stamps heartbeats) and the web server's may differ by that much.
JUST_NOW = 2.0


def relative(seconds: float) -> str:
    """``3 s ago``, ``in 5 min``, or ``just now`` (the same text as console.js)."""
    if abs(seconds) < JUST_NOW:
        return "just now"
    return f"{human_seconds(seconds)} ago" if seconds > 0 else f"in {human_seconds(-seconds)}"


def age_html(moment: datetime | None, now: datetime | None = None) -> SafeString | str:
    """``<time>`` saying how long ago (or in how long) ``moment`` is, exact time on hover."""
    if moment is None:
        return "-"
    now = now or page_now()
    seconds = (now - moment).total_seconds()
    local = timezone.localtime(moment, per_page("time zone", timezone.get_current_timezone))
    if local.year >= 1000:
        # What strftime's "%Y-%m-%d %H:%M:%S" and the milliseconds give (a
        # four-digit year), at a fifth of its cost: ``isoformat`` truncates
        # to milliseconds as ``microsecond // 1000`` does; the offset after
        # the 23rd character is left out.
        stamp = local.isoformat(" ", "milliseconds")[:23]
    else:
        stamp = f"{local:%Y-%m-%d} {local:%H:%M:%S}.{local.microsecond // 1000:03d}"
    # An ISO time, digits, a number and the relative text hold nothing HTML
    # escapes; the time zone's name is escaped (what ``format_safe`` gives,
    # without its calls): escaping works character by character.
    exact = f"{stamp} {zone_name(local.tzname() or '')}"
    return SafeString(
        f'<time class="dispatch-age" datetime="{moment.isoformat()}" data-age="{seconds:.3f}" '
        f'title="{exact}">{relative(seconds)}</time>'
    )


@functools.cache
def zone_name(name: str) -> str:
    """A time zone's name, escaped: a page shows a few, once a row each."""
    return escape(name)


BADGES = {
    "pending": "pending",
    "deferred": "deferred",
    "waiting": "pending",
    "blocked": "blocked",
    "running": "running",
    "succeeded": "ok",
    "failed": "failed",
    "cancelled": "cancelled",
    "step failed": "failed",
    "stuck": "failed",
    "skipped": "cancelled",
    "ready": "pending",
}


def badge_html(state: str, label: str | None = None) -> SafeString:
    """A coloured state badge; the colour follows the state, the text says it."""
    kind = BADGES.get(state.lower(), "pending")
    return format_safe(
        '<span class="dispatch-badge dispatch-badge-{}">{}</span>', kind, label or state
    )


def short_text(text: Any, length: int) -> str:
    """``Truncator(text).chars(length)``, the same text, without its per-character
    walk where nothing is cut: Truncator returns short text NFC-normalized, whole."""
    if type(text) is str:
        normal = unicodedata.normalize("NFC", text)
        if len(normal) <= length:
            return normal
    return Truncator(text).chars(length)
