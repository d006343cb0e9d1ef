"""Cron time semantics (requirement 7), pure logic: no database.

Instants are written in UTC. Europe/Paris is CET (+1) in winter and CEST (+2) in summer; in
2026 it springs forward on 03-29 at 01:00 UTC (02:00 CET -> 03:00 CEST) and falls back on 10-25
at 01:00 UTC (03:00 CEST -> 02:00 CET). America/New_York falls back on 2026-11-01 at 06:00 UTC
(02:00 EDT -> 01:00 EST).
"""

import ast
import itertools
import random
import time
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from django_dispatch.core import cron
from django_dispatch.core.cron import (
    ALL,
    LATEST,
    POLICIES,
    SKIP,
    CronError,
    fire_times,
    latest_slot,
    next_fire,
    slots_to_fire,
    validate,
)

PARIS = "Europe/Paris"
BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local_day(tz: str, day: date) -> tuple[datetime, datetime]:
    """The (start, end] instants bounding one local calendar day, shifted by a tick so that
    a slot at local midnight belongs to the day it starts."""
    zone = ZoneInfo(tz)
    start = datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(UTC)
    following = day + timedelta(days=1)
    end = datetime(following.year, following.month, following.day, tzinfo=zone).astimezone(UTC)
    tick = timedelta(microseconds=1)
    return start - tick, end - tick


# --- spring forward --------------------------------------------------------------------------


def test_daily_0230_on_spring_forward_day_fires_once_at_first_valid_instant():
    times = fire_times("30 2 * * *", PARIS, utc(2026, 3, 27), utc(2026, 3, 31))
    assert times == [
        utc(2026, 3, 27, 1, 30),  # 02:30 CET
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 0),  # 02:30 does not exist: 03:00 CEST, right after the gap
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]
    assert times[2].astimezone(ZoneInfo(PARIS)).strftime("%H:%M %Z") == "03:00 CEST"


def test_every_30_minutes_has_no_duplicate_in_the_spring_gap():
    # 02:00 and 02:30 do not exist; 03:00 CEST (01:00 UTC) fires once.
    assert fire_times("*/30 * * * *", PARIS, utc(2026, 3, 29, 0), utc(2026, 3, 29, 2)) == [
        utc(2026, 3, 29, 0, 30),  # 01:30 CET
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST
        utc(2026, 3, 29, 1, 30),
        utc(2026, 3, 29, 2, 0),
    ]


def test_clock_slots_in_the_gap_and_right_after_it_merge_into_one_fire():
    # 02:00, 02:30 (in the gap) and 03:00 all land on 03:00 CEST; 03:30 follows.
    assert fire_times("0,30 2,3 * * *", PARIS, utc(2026, 3, 28, 12), utc(2026, 3, 29, 12)) == [
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 29, 1, 30),
    ]
    assert fire_times("*/5 2 * * *", PARIS, utc(2026, 3, 28, 12), utc(2026, 3, 29, 12)) == [
        utc(2026, 3, 29, 1, 0)
    ]


def test_interval_entry_gets_no_extra_run_in_the_spring_gap():
    # Hourly at :07: 01:07 CET then 03:07 CEST, one real hour apart; nothing at 03:00.
    assert fire_times("7 * * * *", PARIS, utc(2026, 3, 28, 23, 30), utc(2026, 3, 29, 2)) == [
        utc(2026, 3, 29, 0, 7),
        utc(2026, 3, 29, 1, 7),
    ]


# --- fall back -------------------------------------------------------------------------------


def test_daily_0230_on_fall_back_day_fires_once_at_first_occurrence():
    assert fire_times("30 2 * * *", PARIS, utc(2026, 10, 23), utc(2026, 10, 27)) == [
        utc(2026, 10, 23, 0, 30),  # 02:30 CEST
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, first of the two 02:30s; not 01:30 UTC
        utc(2026, 10, 26, 1, 30),  # 02:30 CET
    ]


def test_daily_0130_on_us_fall_back_day_fires_once():
    assert fire_times("30 1 * * *", NEW_YORK, utc(2026, 10, 31), utc(2026, 11, 3)) == [
        utc(2026, 10, 31, 5, 30),  # 01:30 EDT
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT, first occurrence only
        utc(2026, 11, 2, 6, 30),  # 01:30 EST
    ]


def test_hourly_fires_for_both_repeated_hours_in_paris():
    assert fire_times("0 * * * *", PARIS, utc(2026, 10, 24, 22, 30), utc(2026, 10, 25, 2)) == [
        utc(2026, 10, 24, 23, 0),  # 01:00 CEST
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 1, 0),  # 02:00 CET, the repeated hour
        utc(2026, 10, 25, 2, 0),  # 03:00 CET
    ]


def test_hourly_fires_for_both_repeated_0100_hours_in_new_york():
    assert fire_times("0 * * * *", NEW_YORK, utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 7)) == [
        utc(2026, 11, 1, 5, 0),  # 01:00 EDT
        utc(2026, 11, 1, 6, 0),  # 01:00 EST
        utc(2026, 11, 1, 7, 0),  # 02:00 EST
    ]


def test_every_15_minutes_fires_in_both_passes_of_the_repeated_hour():
    times = fire_times("*/15 * * * *", PARIS, utc(2026, 10, 24, 23, 50), utc(2026, 10, 25, 2))
    expected = [utc(2026, 10, 25, 0, 0) + timedelta(minutes=15 * i) for i in range(9)]
    assert times == expected  # every quarter of an hour of real time, no gap, no duplicate


def test_clock_entry_with_minutes_in_the_repeated_hour_fires_in_first_pass_only():
    times = fire_times("*/15 2 * * *", PARIS, utc(2026, 10, 24, 12), utc(2026, 10, 25, 12))
    assert times == [utc(2026, 10, 25, 0, m) for m in (0, 15, 30, 45)]
    # Every two hours names particular hours, so 02:00 fires once too.
    times = fire_times("0 */2 * * *", PARIS, utc(2026, 10, 24, 21, 30), utc(2026, 10, 25, 3, 30))
    assert times == [
        utc(2026, 10, 24, 22),  # 00:00 CEST
        utc(2026, 10, 25, 0),  # 02:00 CEST
        utc(2026, 10, 25, 3),  # 04:00 CET
    ]


def test_next_fire_from_inside_the_repeated_hour():
    # 00:40 UTC is 02:40 CEST, first pass. Next: 02:45 CEST, then the second pass.
    after = utc(2026, 10, 25, 0, 40)
    assert next_fire("*/15 * * * *", PARIS, after) == utc(2026, 10, 25, 0, 45)
    assert next_fire("*/15 * * * *", PARIS, utc(2026, 10, 25, 0, 45)) == utc(2026, 10, 25, 1)
    # 01:10 UTC is 02:10 CET, second pass: the daily 02:30 already fired in the first pass.
    assert next_fire("30 2 * * *", PARIS, utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 26, 1, 30)
    assert next_fire("30 2 * * *", PARIS, utc(2026, 10, 25, 0, 10)) == utc(2026, 10, 25, 0, 30)


# --- wall clock, not 24 h arithmetic ---------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "until", "expected"),
    [
        (
            utc(2026, 3, 27),
            utc(2026, 3, 31),
            [utc(2026, 3, 27, 5), utc(2026, 3, 28, 5), utc(2026, 3, 29, 4), utc(2026, 3, 30, 4)],
        ),
        (
            utc(2026, 10, 23),
            utc(2026, 10, 27),
            [
                utc(2026, 10, 23, 4),
                utc(2026, 10, 24, 4),
                utc(2026, 10, 25, 5),
                utc(2026, 10, 26, 5),
            ],
        ),
    ],
)
def test_daily_0600_berlin_stays_at_0600_local_across_the_change(after, until, expected):
    times = fire_times("0 6 * * *", BERLIN, after, until)
    assert times == expected
    assert {t.astimezone(ZoneInfo(BERLIN)).strftime("%H:%M") for t in times} == {"06:00"}


@pytest.mark.parametrize("tz", [PARIS, NEW_YORK, "Australia/Lord_Howe"])
def test_every_clock_time_fires_exactly_once_on_every_local_day_of_the_year(tz):
    zone = ZoneInfo(tz)
    days = [date(2026, 1, 1) + timedelta(days=i) for i in range(365)]
    for hour in range(24):
        times = fire_times(f"30 {hour} * * *", tz, *_year_window(tz))
        local = [t.astimezone(zone) for t in times]
        assert [t.date() for t in local] == days, hour
        # Always the asked-for wall time, except when it does not exist that day: then it is
        # the first valid instant after the gap.
        for moment in local:
            if (moment.hour, moment.minute) != (hour, 30):
                wall = moment.replace(tzinfo=None, hour=hour, minute=30)
                naive_round_trip = (
                    wall.replace(tzinfo=zone).astimezone(UTC).astimezone(zone).replace(tzinfo=None)
                )
                assert naive_round_trip != wall, f"{moment} fired off its wall time"
                just_before = moment - timedelta(seconds=1)
                assert just_before.astimezone(zone).utcoffset() != moment.utcoffset()


def _year_window(tz: str) -> tuple[datetime, datetime]:
    start, _ = local_day(tz, date(2026, 1, 1))
    _, end = local_day(tz, date(2026, 12, 31))
    return start, end


@pytest.mark.parametrize("tz", [PARIS, NEW_YORK, "Australia/Sydney"])
def test_hourly_fires_once_per_real_hour_every_day_of_the_year(tz):
    counts: dict[int, int] = {}
    for offset in range(365):
        day = date(2026, 1, 1) + timedelta(days=offset)
        start, end = local_day(tz, day)
        times = fire_times("0 * * * *", tz, start, end)
        hours = round((end - start) / timedelta(hours=1))
        assert len(times) == hours, day
        assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(times))
        counts[hours] = counts.get(hours, 0) + 1
    assert counts == {23: 1, 24: 363, 25: 1}


def test_utc_zone_and_aware_inputs_in_any_zone():
    plus_five = timezone(timedelta(hours=5))
    # 15:00 at +05:00 is 10:00 UTC.
    assert next_fire("0 * * * *", "UTC", datetime(2026, 6, 1, 15, tzinfo=plus_five)) == utc(
        2026, 6, 1, 11
    )
    result = next_fire("0 6 * * *", BERLIN, datetime(2026, 6, 1, 15, tzinfo=plus_five))
    assert result.tzinfo is UTC
    assert result == utc(2026, 6, 2, 4)


def test_next_fire_is_strictly_after():
    assert next_fire("0 * * * *", "UTC", utc(2026, 1, 1, 10)) == utc(2026, 1, 1, 11)
    assert next_fire("0 * * * *", "UTC", utc(2026, 1, 1, 9, 59, 59, 999999)) == utc(2026, 1, 1, 10)


def test_six_field_expression_has_seconds_last():
    assert next_fire("*/5 * * * * 15", "UTC", utc(2026, 1, 1, 10)) == utc(2026, 1, 1, 10, 0, 15)
    assert next_fire("*/5 * * * * 15", "UTC", utc(2026, 1, 1, 10, 0, 15)) == utc(
        2026, 1, 1, 10, 5, 15
    )
    assert fire_times("* * * * * *", PARIS, utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 3)) == [
        utc(2026, 1, 1, 0, 0, 1),
        utc(2026, 1, 1, 0, 0, 2),
        utc(2026, 1, 1, 0, 0, 3),
    ]
    # Seconds through the repeated hour: every real second, once.
    times = fire_times(
        "* * * * * *", PARIS, utc(2026, 10, 25, 0, 59, 58), utc(2026, 10, 25, 1, 0, 2)
    )
    assert times == [utc(2026, 10, 25, 0, 59, 59)] + [utc(2026, 10, 25, 1, 0, s) for s in (0, 1, 2)]


def test_aliases_are_accepted():
    validate("@hourly", PARIS)
    assert next_fire("@daily", "UTC", utc(2026, 1, 1, 5)) == utc(2026, 1, 2)


# --- fire_times contract ---------------------------------------------------------------------

EXPRESSIONS = [
    "*/15 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "0,30 2,3 * * *",
    "*/20 1-3 * * *",
    "0 */2 * * *",
    "*/10 * * * * 30",
    "45 1 * * 0",
]
ZONES = [PARIS, NEW_YORK, "Australia/Lord_Howe", "Australia/Sydney", "UTC", "Asia/Kolkata"]
TRANSITIONS = [
    utc(2026, 3, 29, 1),
    utc(2026, 10, 25, 1),
    utc(2026, 3, 8, 7),
    utc(2026, 11, 1, 6),
    utc(2026, 4, 4, 15),
    utc(2026, 10, 3, 15),
]


def _windows(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        anchor = rng.choice(TRANSITIONS) + timedelta(minutes=rng.randint(-600, 600))
        yield (
            rng.choice(EXPRESSIONS),
            rng.choice(ZONES),
            anchor,
            anchor + timedelta(minutes=rng.randint(0, 1800)),
        )


def test_fire_times_ascending_unique_and_consistent_with_every_other_view():
    for expression, tz, after, until in _windows(seed=7, count=150):
        times = fire_times(expression, tz, after, until)
        assert times == sorted(set(times)), (expression, tz, after)
        assert all(after < t <= until and t.tzinfo is UTC for t in times)
        # Walking next_fire gives the same slots.
        walked, cursor = [], after
        while (cursor := next_fire(expression, tz, cursor)) <= until:
            walked.append(cursor)
        assert walked == times, (expression, tz, after)
        # The backward walk used by the policies gives the same slots.
        fired, _ = slots_to_fire(expression, tz, last_slot=after, now=until, policy=ALL, cap=10_000)
        assert fired == times, (expression, tz, after)
        newest = latest_slot(expression, tz, until)
        if times:
            assert newest == times[-1], (expression, tz, until)
        else:
            assert newest is None or newest <= after, (expression, tz, until)


def test_fire_times_is_bounded():
    with pytest.raises(CronError, match="more than 100 slots"):
        fire_times("* * * * *", "UTC", utc(2026, 1, 1), utc(2026, 1, 2), limit=100)
    assert len(fire_times("* * * * *", "UTC", utc(2026, 1, 1), utc(2026, 1, 1, 1, 40), limit=100))
    assert fire_times("* * * * *", "UTC", utc(2026, 1, 2), utc(2026, 1, 1)) == []


def test_sparse_expression_is_found_years_ahead():
    assert next_fire("0 0 29 2 *", PARIS, utc(2026, 1, 1)) == utc(2028, 2, 28, 23)


# --- validation ------------------------------------------------------------------------------


FIVE_FIELDS = (
    "Use five fields (minute hour day month weekday) or six with seconds last, "
    "or an alias such as '@hourly'."
)


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        # Out of range: the field is named, with its range.
        ("61 * * * *", "minute field: 61 is out of range 0-59."),
        ("0 24 * * *", "hour field: 24 is out of range 0-23."),
        ("0 0 0 * *", "day-of-month field: 0 is out of range 1-31."),
        ("0 0 * 13 *", "month field: 13 is out of range 1-12."),
        ("0 0 * * 8", "day-of-week field: 8 is out of range 0-7."),
        ("5-70 * * * *", "minute field: 70 is out of range 0-59."),
        ("0,15,75 * * * *", "minute field: 75 is out of range 0-59."),
        ("* * * * * 61", "second field: 61 is out of range 0-59."),
        (
            "0 25 32 * *",
            "hour field: 25 is out of range 0-23; day-of-month field: 32 is out of range 1-31.",
        ),
        # Steps larger than the field: croniter reads them as the first value only.
        (
            "*/61 * * * *",
            "minute field: the step in '*/61' is larger than the field's range "
            "0-59 (60 values), so it would match once per hour only (use a step from 1 to 60).",
        ),
        (
            "0 */25 * * *",
            "hour field: the step in '*/25' is larger than the field's range "
            "0-23 (24 values), so it would match once per day only (use a step from 1 to 24).",
        ),
        (
            "0 0 */32 * *",
            "day-of-month field: the step in '*/32' is larger than the field's "
            "range 1-31 (31 values), so it would match once per month only (use a step from 1 "
            "to 31).",
        ),
        (
            "0 0 1 */13 *",
            "month field: the step in '*/13' is larger than the field's range "
            "1-12 (12 values), so it would match once per year only (use a step from 1 to 12).",
        ),
        (
            "0 0 * * */8",
            "day-of-week field: the step in '*/8' is larger than the field's "
            "range 0-6 (7 values), so it would match once per week only (use a step from 1 to "
            "7).",
        ),
        (
            "* * * * * */61",
            "second field: the step in '*/61' is larger than the field's "
            "range 0-59 (60 values), so it would match once per minute only (use a step from 1 "
            "to 60).",
        ),
        (
            "10-50/61 * * * *",
            "minute field: the step in '10-50/61' is larger than the "
            "field's range 0-59 (60 values), so it would match once per hour only (use a step "
            "from 1 to 60).",
        ),
        (
            "0 0 * jan-dec/13 *",
            "month field: the step in 'jan-dec/13' is larger than the "
            "field's range 1-12 (12 values), so it would match once per year only (use a step "
            "from 1 to 12).",
        ),
        ("*/0 * * * *", "minute field: the step in '*/0' must be at least 1."),
        ("1-5/ * * * *", "minute field: '1-5/' needs a whole number after '/'."),
        # Words that are not names.
        ("0 0 * foo *", "month field: 'foo' is not a month (use 1-12 or jan-dec)."),
        (
            "0 0 * * monday",
            "day-of-week field: 'monday' is not a day of the week (use 0-7 "
            "or sun-sat, where 0 and 7 are Sunday).",
        ),
        ("x * * * *", "minute field: 'x' is not a number (use 0-59)."),
        ("H * * * *", "minute field: 'H' (a hashed value) is not supported (give 0-59)."),
        # Other syntax croniter refuses: the field is found by trying each one alone.
        (
            "0.5 * * * *",
            "minute field: '0.5' is not valid (use 0-59, lists such as 1,3, "
            "ranges such as 1-5 and steps such as */2).",
        ),
        (
            "0 0 * * 5#6",
            "day-of-week field: '5#6' is not valid (use 0-7 or sun-sat, where 0 "
            "and 7 are Sunday, lists such as 1,3, ranges such as 1-5 and steps such as */2).",
        ),
        (
            "0 0 ? ? *",
            "month field: '?' is not valid (use 1-12 or jan-dec, lists such as "
            "1,3, ranges such as 1-5 and steps such as */2).",
        ),
        # The shape: only a wrong number of fields gets the reminder of the format.
        ("* * * *", f"it has 4 fields. {FIVE_FIELDS}"),
        ("* * * * * * *", f"it has 7 fields. {FIVE_FIELDS}"),
        ("", f"it is empty. {FIVE_FIELDS}"),
        ("   ", f"it is empty. {FIVE_FIELDS}"),
        (
            "@reboot",
            "'@reboot' is not an alias. Use one of @yearly, @annually, @monthly, "
            "@weekly, @daily, @midnight, @hourly.",
        ),
    ],
)
def test_invalid_expressions_say_what_is_wrong(expression, problem):
    with pytest.raises(CronError) as caught:
        validate(expression, PARIS)
    assert str(caught.value) == f"{expression!r} is not a valid cron expression: {problem}"


@pytest.mark.parametrize(
    "expression", ["61 * * * *", "*/61 * * * *", "0 0 * * 8", "0.5 * * * *", "a b c d e"]
)
def test_five_field_expressions_are_not_told_to_use_five_fields(expression):
    with pytest.raises(CronError) as caught:
        validate(expression, PARIS)
    assert "five fields" not in str(caught.value)


@pytest.mark.parametrize(
    "expression",
    [
        "*/15 * * * *",
        "0-59/30 * * * *",
        "*/60 * * * *",  # a step equal to the field's size: once an hour, as it says
        "0 */24 * * *",
        "0 0 */31 * *",
        "0 0 1 */12 *",
        "0 0 * * */7",
        "* * * * * */60",
        "*/10 * * * * 30",
        "0 0 * * 7",
        "0 0 * * 0-7",
        "0 9-17 * JAN,jul MON-FRI",
        "0 0 L * *",
        "0 0 1W * *",
        "0 0 * * 1#2",
        "0 0 * * L5",
        "0 0 ? * *",
        "50-10 * * * *",
        "@hourly",
        "@DAILY",
        "@midnight",
        "@weekly",
        "@monthly",
        "@yearly",
        "@annually",
    ],
)
def test_valid_expressions_stay_valid(expression):
    validate(expression, PARIS)


def test_steps_up_to_the_field_size_keep_their_meaning():
    start = utc(2026, 1, 1)
    assert fire_times("0-59/30 * * * *", "UTC", start, utc(2026, 1, 1, 1)) == [
        utc(2026, 1, 1, 0, 30),
        utc(2026, 1, 1, 1),
    ]
    assert fire_times("*/60 * * * *", "UTC", start, utc(2026, 1, 1, 3)) == [
        utc(2026, 1, 1, h) for h in (1, 2, 3)
    ]
    assert next_fire("0 0 * * */7", "UTC", start) == utc(2026, 1, 4)  # a Sunday


def test_a_range_of_one_value_is_that_value():
    # croniter 7 reads "5-5" as "*": every minute instead of minute 5.
    start = utc(2026, 1, 1)
    assert fire_times("5-5 * * * *", "UTC", start, utc(2026, 1, 1, 2)) == [
        utc(2026, 1, 1, 0, 5),
        utc(2026, 1, 1, 1, 5),
    ]
    assert fire_times("0 0 * * 3-3", "UTC", start, utc(2026, 1, 20)) == [
        utc(2026, 1, 7),
        utc(2026, 1, 14),
    ]
    assert fire_times("0 0 * * wed-WED/2,fri", "UTC", start, utc(2026, 1, 10)) == [
        utc(2026, 1, 2),
        utc(2026, 1, 7),
        utc(2026, 1, 9),
    ]
    # "2-2" names one hour: a clock entry, not an interval one.
    assert fire_times("0 2-2 * * *", PARIS, utc(2026, 3, 28), utc(2026, 3, 29, 12)) == [
        utc(2026, 3, 28, 1),
        utc(2026, 3, 29, 1),  # 02:00 does not exist that day: fired at 03:00 CEST
    ]


def test_misspelt_time_zones_get_a_suggestion():
    for given, meant in [
        ("europe/paris", "Europe/Paris"),
        ("utc", "UTC"),
        ("America/NewYork", "America/New_York"),
    ]:
        with pytest.raises(CronError) as caught:
            validate("0 * * * *", given)
        assert f"{given!r} is not a known IANA time zone. Did you mean {meant!r}? " in str(
            caught.value
        )
    with pytest.raises(CronError) as caught:
        validate("0 * * * *", "Mars/Olympus")
    assert "Did you mean" not in str(caught.value)


def test_expression_that_never_fires_is_rejected():
    with pytest.raises(CronError, match="never fires: no date matches it"):
        validate("0 0 30 2 *", PARIS)


@pytest.mark.parametrize("tz", ["Mars/Olympus", "europe/paris", "utc", "", "../etc/passwd"])
def test_unknown_time_zones_are_rejected_with_a_helpful_message(tz):
    with pytest.raises(CronError) as caught:
        validate("0 * * * *", tz)
    assert repr(tz) in str(caught.value)
    assert "IANA time zone" in str(caught.value)
    assert "'Europe/Paris'" in str(caught.value)


def test_valid_entries_pass_and_cron_error_is_a_value_error():
    for tz in (PARIS, BERLIN, "UTC"):
        validate("*/15 * * * *", tz)
        validate("30 6 * * * 0", tz)  # 06:30:00, seconds last
    assert issubclass(CronError, ValueError)


def test_naive_datetimes_are_refused():
    with pytest.raises(CronError, match="timezone-aware"):
        next_fire("0 * * * *", PARIS, datetime(2026, 1, 1))
    with pytest.raises(CronError, match="now must be timezone-aware"):
        slots_to_fire("0 * * * *", PARIS, last_slot=None, now=datetime(2026, 1, 1))


def test_module_is_pure():
    source = Path(cron.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= {
        "__future__",
        "difflib",
        "heapq",
        "re",
        "collections",
        "dataclasses",
        "datetime",
        "functools",
        "zoneinfo",
        "croniter",
    }


# --- misfire policies ------------------------------------------------------------------------

MINUTELY = "* * * * *"
DOWN_LAST = utc(2026, 5, 4, 10, 0)
DOWN_NOW = utc(2026, 5, 4, 10, 5, 30)  # five intervals missed: 10:01 to 10:05


def minute(m: int) -> datetime:
    return utc(2026, 5, 4, 10, m)


def fire(policy: str, last=DOWN_LAST, now=DOWN_NOW, **kw) -> tuple[list[datetime], datetime]:
    return slots_to_fire(MINUTELY, PARIS, last_slot=last, now=now, policy=policy, **kw)


def test_policy_constants():
    assert (SKIP, LATEST, ALL) == ("skip", "latest", "all")
    assert POLICIES == (SKIP, LATEST, ALL)


def test_after_downtime_skip_fires_nothing():
    assert fire(SKIP) == ([], minute(6))


def test_skip_is_the_default():
    assert slots_to_fire(MINUTELY, PARIS, last_slot=DOWN_LAST, now=DOWN_NOW) == fire(SKIP)


def test_after_downtime_latest_fires_the_newest_missed_slot_once():
    assert fire(LATEST) == ([minute(5)], minute(6))


def test_after_downtime_all_fires_every_missed_slot_in_order():
    assert fire(ALL) == ([minute(m) for m in range(1, 6)], minute(6))


def test_all_with_a_cap_keeps_the_newest():
    assert fire(ALL, cap=2) == ([minute(4), minute(5)], minute(6))
    assert fire(ALL, cap=5) == fire(ALL, cap=100)


def test_a_lone_late_slot_fires_under_every_policy():
    # Down from 10:04:10 to 10:05:30: only 10:05 came due, nothing was missed.
    for policy in POLICIES:
        assert fire(policy, last=minute(4)) == ([minute(5)], minute(6)), policy
    # Even very late: a daily entry whose scheduler was down most of the day still runs.
    fired, next_run_at = slots_to_fire(
        "0 3 * * *", PARIS, last_slot=utc(2026, 5, 3, 1), now=utc(2026, 5, 4, 20), policy=SKIP
    )
    assert fired == [utc(2026, 5, 4, 1)]
    assert next_run_at == utc(2026, 5, 5, 1)


def test_nothing_due():
    for policy in POLICIES:
        assert fire(policy, last=minute(5)) == ([], minute(6))
        # A watermark ahead of now (clock skew) fires nothing and never returns a settled slot.
        assert fire(policy, last=minute(8)) == ([], minute(9))


def test_grace_makes_recent_slots_on_time():
    grace = timedelta(minutes=2)  # on time: slots at or after 10:03:30
    assert fire(SKIP, grace=grace) == ([minute(4), minute(5)], minute(6))
    assert fire(LATEST, grace=grace) == ([minute(3), minute(4), minute(5)], minute(6))
    assert fire(ALL, grace=grace) == fire(ALL)
    assert fire(LATEST, grace=grace, cap=2) == ([minute(4), minute(5)], minute(6))
    # The boundary is inclusive: a slot exactly grace old is on time.
    assert fire(SKIP, grace=timedelta(minutes=1, seconds=30)) == (
        [minute(4), minute(5)],
        minute(6),
    )


def test_handover_shorter_than_grace_skips_no_slot_in_the_gap():
    # The scheduler that fired 10:00 died; another took over at 10:02:05.
    fired, next_run_at = fire(SKIP, now=utc(2026, 5, 4, 10, 2, 5), grace=timedelta(seconds=90))
    assert fired == [minute(1), minute(2)]
    assert next_run_at == minute(3)


def test_a_new_entry_fires_nothing_for_the_past():
    for policy in POLICIES:
        assert fire(policy, last=None) == ([], minute(6)), policy
    fired, next_run_at = slots_to_fire(
        "30 2 * * *", PARIS, last_slot=None, now=utc(2026, 3, 28, 12), policy=ALL
    )
    assert fired == []
    assert next_run_at == utc(2026, 3, 29, 1)  # the spring-forward slot, at 03:00 CEST


def test_policies_across_the_repeated_hour():
    last, now = utc(2026, 10, 24, 23, 0), utc(2026, 10, 25, 1, 30)
    fired, next_run_at = slots_to_fire("0 * * * *", PARIS, last_slot=last, now=now, policy=ALL)
    assert fired == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 1)]  # both 02:00s
    assert next_run_at == utc(2026, 10, 25, 2)
    fired, _ = slots_to_fire("0 * * * *", PARIS, last_slot=last, now=now, policy=LATEST)
    assert fired == [utc(2026, 10, 25, 1)]
    fired, _ = slots_to_fire("30 2 * * *", PARIS, last_slot=last, now=now, policy=ALL)
    assert fired == [utc(2026, 10, 25, 0, 30)]


def test_policies_nest_skip_in_latest_in_all():
    rng = random.Random(11)
    for expression, tz, last, now in _windows(seed=3, count=120):
        grace = timedelta(minutes=rng.choice([0, 0, 5, 45, 200]))
        cap = rng.choice([1, 3, 100])
        results = {
            policy: slots_to_fire(
                expression, tz, last_slot=last, now=now, policy=policy, cap=cap, grace=grace
            )
            for policy in POLICIES
        }
        skip, latest, everything = (results[p][0] for p in POLICIES)
        due = fire_times(expression, tz, last, now)
        assert set(skip) <= set(latest) <= set(everything) == set(due[-cap:])
        assert len({results[p][1] for p in POLICIES}) == 1
        assert results[SKIP][1] == next_fire(expression, tz, max(now, last))
        for fired in (skip, latest):
            assert fired == sorted(fired) and len(fired) <= cap


def test_polling_with_now_as_watermark_fires_every_slot_exactly_once():
    # A scheduler polling every 50 s through the autumn change, persisting now as the watermark.
    for expression in ("*/15 * * * *", "0 * * * *", "30 2 * * *", "*/20 2-3 * * *"):
        start, end = utc(2026, 10, 24, 22), utc(2026, 10, 25, 3)
        watermark, now, fired = start, start, []
        while now < end:
            now += timedelta(seconds=50)
            slots, next_run_at = slots_to_fire(
                expression, PARIS, last_slot=watermark, now=now, policy=SKIP
            )
            fired += slots
            assert next_run_at > now
            watermark = now
        assert fired == fire_times(expression, PARIS, start, now), expression


def test_long_outage_is_cheap():
    begun = time.perf_counter()
    fired, next_run_at = slots_to_fire(
        "* * * * * *", PARIS, last_slot=utc(2025, 1, 1), now=utc(2026, 5, 4, 10), policy=ALL
    )
    assert fired == [utc(2026, 5, 4, 9, 58, 20) + timedelta(seconds=s) for s in range(1, 101)]
    assert next_run_at == utc(2026, 5, 4, 10, 0, 1)
    for policy in (SKIP, LATEST):
        slots_to_fire(
            "* * * * * *", PARIS, last_slot=utc(2025, 1, 1), now=utc(2026, 5, 4, 10), policy=policy
        )
    assert time.perf_counter() - begun < 2


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"policy": "sometimes"}, "'sometimes' is not a misfire policy. Use one of: 'skip'"),
        ({"cap": 0}, "cap must be a positive int"),
        ({"grace": timedelta(seconds=-1)}, "grace must not be negative"),
    ],
)
def test_bad_policy_arguments(kwargs, fragment):
    with pytest.raises(CronError, match=fragment):
        slots_to_fire(MINUTELY, PARIS, last_slot=DOWN_LAST, now=DOWN_NOW, **kwargs)
