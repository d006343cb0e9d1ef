"""Server-side SVG charts for the admin: no JavaScript framework, no CDN.

Many admins run offline and behind strict content security policies, so the
charts are plain inline SVG built here. They carry no colours of their own:
every fill and stroke is a class styled with the admin's CSS variables
(``--link-fg``, ``--error-fg``, ``--body-quiet-color``…) in
``templates/django_dispatch/admin/styles.html``, so they follow the admin's
light and dark themes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

BAR = 10  # px per minute
HEIGHT = 120
AXIS = 18  # room for the time labels below the bars


def _scale(peak: int) -> int:
    """A round top for the y axis: 1, 2, 5, 10, 20, 50…"""
    top = 1
    while top < peak:
        top = top * 5 // 2 if str(top)[0] == "2" else top * 2
    return top


def throughput_chart(per_minute: Sequence[tuple[datetime, int, int]]) -> SafeString:
    """Stacked bars: jobs succeeded (and failed, on top) per minute, oldest first."""
    if not per_minute:
        return format_html("<p>{}</p>", "No data.")
    width = BAR * len(per_minute)
    top = _scale(max(ok + failed for _, ok, failed in per_minute))
    unit = (HEIGHT - AXIS) / top
    bars = []
    for i, (minute, ok, failed) in enumerate(per_minute):
        x = i * BAR + 1
        label = f"{timezone.localtime(minute):%H:%M}: {ok} succeeded, {failed} failed"
        ok_h, failed_h = ok * unit, failed * unit
        base = HEIGHT - AXIS
        # Numbers formatted here (format_html escapes them to strings first);
        # the only text, the label, is escaped.
        bars.append(
            f"<g><title>{escape(label)}</title>"
            f'<rect class="dispatch-bar-ok" x="{x}" y="{base - ok_h:.1f}" '
            f'width="{BAR - 2}" height="{ok_h:.1f}"/>'
            f'<rect class="dispatch-bar-failed" x="{x}" y="{base - ok_h - failed_h:.1f}" '
            f'width="{BAR - 2}" height="{failed_h:.1f}"/></g>'
        )
    ticks = format_html_join(
        "",
        '<text class="dispatch-axis" x="{}" y="{}" text-anchor="{}">{}</text>',
        (
            (
                i * BAR + BAR // 2,
                HEIGHT - 4,
                "start" if i == 0 else "end" if i == len(per_minute) - 1 else "middle",
                f"{timezone.localtime(m):%H:%M}",
            )
            for i, (m, _, _) in enumerate(per_minute)
            if i % 10 == 0 or i == len(per_minute) - 1
        ),
    )
    return format_html(
        '<svg class="dispatch-chart" viewBox="0 0 {w} {h}" role="img" '
        'aria-label="Jobs finished per minute, last hour" preserveAspectRatio="none">'
        '<line class="dispatch-grid" x1="0" x2="{w}" y1="1" y2="1"/>'
        '<line class="dispatch-grid" x1="0" x2="{w}" y1="{base}" y2="{base}"/>'
        '<text class="dispatch-axis" x="2" y="12">{top}/min</text>{bars}{ticks}</svg>',
        w=width,
        h=HEIGHT,
        base=HEIGHT - AXIS,
        top=top,
        bars=mark_safe("".join(bars)),  # numbers and an escaped label only
        ticks=ticks,
    )


def sparkline(values: Sequence[int], width: int = 60, height: int = 22) -> SafeString:
    """A queue's throughput over the window as one line (empty: a flat line)."""
    values = list(values) or [0, 0]
    peak = max(values) or 1
    step = width / max(len(values) - 1, 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - v * (height - 4) / peak:.1f}" for i, v in enumerate(values)
    )
    return format_html(
        '<svg class="dispatch-spark" viewBox="0 0 {} {}" width="{}" height="{}" '
        'aria-hidden="true"><polyline points="{}"/></svg>',
        width,
        height,
        width,
        height,
        points,
    )
