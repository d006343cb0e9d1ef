"""Template tags of the operations console: ages, durations, state badges, charts.

The HTML itself is built in ``admin.display`` and ``admin.charts``, which
the admin's list columns use too; these tags make it available to the
console's templates.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils.safestring import SafeString

from ..admin import charts
from ..admin.aliases import on_selected_alias
from ..admin.display import age_html, badge_html, human_seconds

register = template.Library()


@register.filter
def on_alias(url: str) -> str:
    """``url`` on the alias the page is about (``?alias=``), where one was picked:
    a link to a row by id must open that database's row."""
    return on_selected_alias(str(url))


@register.filter
def duration(value: float | timedelta | None) -> str:
    """Seconds or a timedelta as ``human_seconds`` text."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return human_seconds(value)


@register.simple_tag
def age(moment: datetime | None, now: datetime | None = None) -> SafeString | str:
    return age_html(moment, now)


@register.simple_tag
def badge(state: str, label: str | None = None) -> SafeString:
    return badge_html(state, label)


@register.simple_tag
def throughput_chart(per_minute: list[tuple[datetime, int, int]]) -> SafeString:
    return charts.throughput_chart(per_minute)


@register.simple_tag
def sparkline(values: list[int]) -> SafeString:
    return charts.sparkline(values)
