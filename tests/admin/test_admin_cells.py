"""The change lists' per-row helpers give what the slower calls they replace give.

``age_html``, ``short_text``, ``state_label`` and the whole-number cells of
``admin.rows`` each skip work Django (or ``format_safe``) does per row; each
is compared here, value by value, with the call it stands for.
"""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.contrib.admin.utils import display_for_field
from django.test import override_settings
from django.utils import timezone as dj_timezone
from django.utils import translation
from django.utils.text import Truncator

from django_dispatch.admin.display import (
    age_html,
    format_safe,
    one_page,
    per_page,
    relative,
    short_text,
)
from django_dispatch.admin.job_columns import state_label
from django_dispatch.admin.rows import field_cell, plain_numbers
from django_dispatch.models import DeadLetter, Job


def reference_age(moment: datetime, now: datetime) -> str:
    """``age_html`` as it was written first: ``format_safe`` and ``strftime``."""
    seconds = (now - moment).total_seconds()
    local = dj_timezone.localtime(moment)
    exact = f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local.tzname() or ''}"
    return format_safe(
        '<time class="dispatch-age" datetime="{}" data-age="{}" title="{}">{}</time>',
        moment.isoformat(),
        f"{seconds:.3f}",
        exact,
        relative(seconds),
    )


ZONES = [
    UTC,
    zoneinfo.ZoneInfo("Europe/Berlin"),
    zoneinfo.ZoneInfo("America/St_Johns"),
    timezone(timedelta(hours=3), "<&\"'>"),  # a name HTML must escape
]


@pytest.mark.parametrize("zone", ZONES, ids=str)
def test_age_html_is_the_reference(zone: timezone) -> None:
    now = datetime(2026, 12, 5, 10, 0, 0, 123456, tzinfo=UTC)
    moments = [
        now,
        now - timedelta(seconds=1.5),
        now - timedelta(minutes=3, microseconds=999),
        now + timedelta(hours=5),
        now - timedelta(days=400),
        datetime(1999, 1, 2, 3, 4, 5, tzinfo=UTC),
        datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC),  # strftime's own %Y below year 1000
        datetime(2026, 3, 29, 1, 30, tzinfo=UTC),  # a daylight saving change in Berlin
    ]
    with dj_timezone.override(zone):
        for moment in moments:
            assert age_html(moment, now) == reference_age(moment, now)
        with one_page():  # the zone looked up once for the page's rows: the same text
            for moment in moments:
                assert age_html(moment, now) == reference_age(moment, now)
    assert age_html(None) == "-"


def test_a_pages_values_are_that_pages_own() -> None:
    """``per_page`` keeps a value for the rows of one ``one_page``, never past it."""
    made = []

    def make() -> int:
        made.append(1)
        return len(made)

    assert per_page("k", make) == 1 and per_page("k", make) == 2  # outside a page: each call
    with one_page():
        assert per_page("k", make) == per_page("k", make) == 3
        with one_page():  # a page rendered inside another keeps its own
            assert per_page("k", make) == 4
        assert per_page("k", make) == 3
    with one_page():
        assert per_page("k", make) == 5


@pytest.mark.parametrize(
    "text",
    [
        "",
        "boom",
        "x" * 80,
        "x" * 81,
        "y" * 200,
        "e\u0301" * 50,  # 100 characters, 50 once composed
        "e\u0301" * 90,
        "\u0958" * 60,  # a character NFC writes as two
        "\u0958" * 30,
        "<b>not html</b>",
        " spaced \n",
    ],
)
def test_short_text_is_truncators(text: str) -> None:
    assert short_text(text, 80) == Truncator(text).chars(80)
    assert short_text(text, 1) == Truncator(text).chars(1)


def test_state_label_is_get_state_display() -> None:
    for state in [*Job._meta.get_field("state").flatchoices, ("made-up", "")]:
        job = Job(state=state[0])
        assert state_label(job) == job.get_state_display()
    with translation.override("de"):
        job = Job(state="failed")
        assert state_label(job) == job.get_state_display()


@pytest.mark.parametrize("grouping", [False, True])
def test_whole_numbers_are_djangos(grouping: bool) -> None:
    field = DeadLetter._meta.get_field("id")
    with override_settings(USE_THOUSAND_SEPARATOR=grouping, NUMBER_GROUPING=3):
        cell = field_cell("field-id", "id", field, "-")
        assert plain_numbers(field) is not grouping
        for value in [0, 7, -12, 1234567, 10**15, None]:
            letter = DeadLetter(id=value)
            shown = cell(letter)[1]
            expected = display_for_field(value, field, "-")
            assert shown == str(expected), value
    assert not plain_numbers(Job._meta.get_field("state"))


def test_the_row_checkbox_is_djangos() -> None:
    """The row checkbox written out is what Django's widget renders, escaping and all."""
    from django.contrib import admin

    job_admin = admin.site._registry[Job]
    for job in (Job(pk=7, task_path='a.<b>&"c"', state="failed"), Job(pk=10**12, task_path="x")):
        ours = job_admin.action_checkbox(job)
        assert ours == admin.ModelAdmin.action_checkbox(job_admin, job)
    with translation.override("de"):
        assert job_admin.action_checkbox(job) == admin.ModelAdmin.action_checkbox(job_admin, job)
