"""Cron fire times in an entry's IANA time zone, with explicit DST and misfire semantics.

Pure logic: no database, no models, no settings. Callers pass the entry's time zone, or
``settings.TIME_ZONE`` when the entry has none, and the database clock as ``now``.

How a slot is computed
======================

croniter's own DST handling has a history of bugs (duplicate or missing fires around the
change), so it is never given a real time zone here. The expression is iterated over *naive
local wall-clock* times (croniter sees them as UTC, which has no DST, so its arithmetic is plain
calendar arithmetic), and each wall time is then mapped to a real instant with ``zoneinfo``.
Slots therefore always come from the expression and the local calendar, never from adding
24 h to the previous run: a daily 06:00 Europe/Berlin entry fires at 05:00 UTC in winter and
04:00 UTC in summer.

Every function returns aware UTC datetimes, in ascending order and without duplicates.

DST rules
=========

An entry is an *interval entry* when its hour field matches every hour (``*``, ``*/1``,
``0-23``...; for example ``0 * * * *`` or ``*/15 * * * *``), and a *clock entry* otherwise (it
names particular hours: ``30 2 * * *``, ``0 */2 * * *``, ``0 9-17 * * 1-5``). This is the rule
Vixie/ISC cron has used for decades: interval entries follow elapsed time, clock entries follow
the wall clock.

Spring forward (a wall time that does not exist, e.g. 02:30 in Europe/Paris on 2026-03-29):

* clock entry: the slot fires once, at the first valid instant after the gap (03:00 CEST,
  01:00 UTC). Several slots in the same gap, and a slot at the first valid time itself, all land
  on that one instant and fire once (``0,30 2,3 * * *`` fires at 03:00 and 03:30 that day).
  Reason: a "daily at 02:30" job must still run that day, and as soon as possible.
* interval entry: a nonexistent wall time has no slot. The hour did not happen, so nothing was
  missed: an hourly job runs 23 times on the 23-hour day, once per real hour, and ``7 * * * *``
  does not get an extra run at 03:00 seven minutes before its 03:07 run.

Fall back (a wall time that happens twice, e.g. 02:30 in Europe/Paris on 2026-10-25):

* clock entry: fires once, at the first occurrence (fold=0; 02:30 CEST, 00:30 UTC). Reason: a
  "daily at 02:30" job must not run twice in one day.
* interval entry: fires at both occurrences, which are distinct real instants an hour apart:
  an hourly job runs 25 times on the 25-hour day (02:00 CEST and 02:00 CET, 00:00 and 01:00 UTC).

Misfire policies
================

``slots_to_fire`` decides what to enqueue when the scheduler looks at an entry. The *due* slots
are those in ``(last_slot, now]``. A due slot is *on time* when it is at most ``grace`` old
(``slot >= now - grace``; ``grace`` is 0 by default) and *late* otherwise.

* ``skip`` (default): late slots are dropped. On-time slots fire. One exception: when the only
  due slot is late, it fires anyway, because nothing was missed, the scheduler was merely late
  (a restart or a handover shorter than one period).
* ``latest``: on-time slots fire; if any slot is late, the newest late slot fires as well, once.
  A backlog is collapsed into a single catch-up run.
* ``all``: every due slot fires, oldest first.

Whatever the policy, at most ``cap`` slots are returned, and when there are more the *newest*
are kept (the oldest are dropped): after a long outage the recent slots are the ones that still
matter, and the answer does not depend on how often the scheduler polls. With ``grace=0``,
after a scheduler was down for five periods of ``* * * * *`` (``last_slot`` 10:00, ``now``
10:05:30), ``skip`` fires nothing, ``latest`` fires 10:05, ``all`` fires 10:01 to 10:05, and
``all`` with ``cap=2`` fires 10:04 and 10:05. In every case ``next_run_at`` is 10:06.

So that a restart or a handover between schedulers never skips a slot that falls in the gap,
callers should pass a ``grace`` at least as long as a poll interval plus a handover.
"""

from __future__ import annotations

import difflib
import heapq
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter
from croniter.croniter import CroniterBadDateError, CroniterError

__all__ = [
    "ALL",
    "LATEST",
    "POLICIES",
    "SKIP",
    "CronError",
    "fire_times",
    "latest_slot",
    "next_fire",
    "slots_to_fire",
    "validate",
]

SKIP = "skip"
LATEST = "latest"
ALL = "all"
POLICIES: tuple[str, ...] = (SKIP, LATEST, ALL)

_ONE_SECOND = timedelta(seconds=1)
_TICK = timedelta(microseconds=1)
# Offsets are sampled this often, and this far, around a starting instant to bound which wall
# times can map to instants after (or before) it. No zone keeps an offset for less than an hour,
# and no two offsets differ by more than two days.
_SAMPLE_STEP = timedelta(hours=1)
_SAMPLE_SPAN = timedelta(days=2)
# Any fixed instant works: validation only checks that the expression can fire at all.
_PROBE = datetime(2000, 1, 1, tzinfo=UTC)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CronError(ValueError):
    """A cron expression, time zone, policy or argument is not usable. The message says how."""


@dataclass(frozen=True)
class _Schedule:
    expression: str
    zone: ZoneInfo
    interval: bool  # the hour field matches every hour: see the module docstring


def validate(expression: str, timezone: str) -> None:
    """Raise :class:`CronError` unless ``expression`` and ``timezone`` are usable.

    The expression is croniter syntax with five fields (minute hour day month weekday) or six
    (the sixth is seconds), or a croniter alias such as ``@hourly``. It must match at least one
    date (``0 0 30 2 *`` never does). ``timezone`` is an IANA name such as ``Europe/Paris`` or
    ``UTC``. Call this when an entry is declared, so a typo fails at start-up, not at 03:00.
    """
    _compile(expression, timezone)


def next_fire(expression: str, timezone: str, after: datetime) -> datetime:
    """The first slot strictly after ``after`` (any aware datetime), as an aware UTC datetime.

    Raises :class:`CronError` if the entry never fires again.
    """
    schedule = _compile(expression, timezone)
    return _next(schedule, _aware_utc(after, "after"))


def fire_times(
    expression: str,
    timezone: str,
    after: datetime,
    until: datetime,
    *,
    limit: int = 10_000,
) -> list[datetime]:
    """Every slot in ``(after, until]``, as aware UTC datetimes, ascending and unique.

    Raises :class:`CronError` when there are more than ``limit`` slots, so that a wide window
    on a dense expression cannot exhaust memory.
    """
    schedule = _compile(expression, timezone)
    start = _aware_utc(after, "after")
    end = _aware_utc(until, "until")
    found: list[datetime] = []
    for slot in _forward(schedule, start):
        if slot > end:
            break
        found.append(slot)
        if len(found) > limit:
            raise CronError(
                f"{expression!r} has more than {limit} slots between {start.isoformat()} and "
                f"{end.isoformat()}. Use a narrower window or a larger limit."
            )
    return found


def latest_slot(expression: str, timezone: str, at: datetime) -> datetime | None:
    """The newest slot at or before ``at``, as an aware UTC datetime, or None if there is none.

    Useful to report an entry's most recent slot, and as the watermark to persist after
    :func:`slots_to_fire` (see there).
    """
    schedule = _compile(expression, timezone)
    return next(_backward(schedule, _aware_utc(at, "at")), None)


def slots_to_fire(
    expression: str,
    timezone: str,
    *,
    last_slot: datetime | None,
    now: datetime,
    policy: str = SKIP,
    cap: int = 100,
    grace: timedelta = timedelta(0),
    first: datetime | None = None,
) -> tuple[list[datetime], datetime]:
    """Return ``(slots to enqueue now, next_run_at)`` for one entry.

    ``first``: an instant the entry was told to fire at first, whatever its
    schedule (``schedules.set_enabled(..., next_run_at=)``; stored as a
    ``next_run_at`` without a watermark). Once ``now`` reaches it, it is the
    one slot fired, whatever the policy; before, nothing fires and it is the
    next run. Then the entry follows its schedule from there.

    ``last_slot`` is the entry's watermark: every slot at or before it is settled, whether it
    fired or the policy skipped it. ``None`` means a new entry, which fires nothing for the past
    and just returns its next slot. ``now`` is the database clock.

    The slots to fire depend on ``policy`` (``skip``, ``latest`` or ``all``), ``grace`` and
    ``cap`` exactly as described in this module's docstring; they are aware UTC datetimes,
    ascending, at most ``cap`` of them (the newest kept). ``next_run_at`` is the first slot
    after both ``now`` and ``last_slot``.

    After enqueueing, persist ``now`` (or ``latest_slot(..., now)``) as the new watermark, not
    only the newest slot fired: otherwise the slots that ``skip`` dropped stay due, and since
    they keep counting as missed, ``skip`` with ``grace=0`` would never fire the entry again.
    """
    if policy not in POLICIES:
        raise CronError(
            f"{policy!r} is not a misfire policy. Use one of: {', '.join(map(repr, POLICIES))}."
        )
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise CronError(f"cap must be a positive int, got {cap!r}.")
    if grace < timedelta(0):
        raise CronError(f"grace must not be negative, got {grace!r}.")
    schedule = _compile(expression, timezone)
    now = _aware_utc(now, "now")
    last = None if last_slot is None else _aware_utc(last_slot, "last_slot")
    if first is not None and last is None:
        first = _aware_utc(first, "first")
        if now < first:
            return [], first
        return [first], _next(schedule, now)

    next_run_at = _next(schedule, now if last is None else max(now, last))
    if last is None or now <= last:
        return [], next_run_at

    # Late slots are in (last, latest_late]; on-time slots are in (max(last, latest_late), now].
    latest_late = now - grace - _TICK
    on_time = _newest(schedule, max(last, latest_late), now, cap)
    if policy == ALL:
        fired = _newest(schedule, last, now, cap)
    elif policy == LATEST:
        newest_late = _newest(schedule, last, latest_late, 1) if latest_late > last else []
        fired = (newest_late + on_time)[-cap:]
    elif on_time:  # SKIP
        fired = on_time
    else:
        due = _oldest(schedule, last, now, 2)
        fired = due if len(due) == 1 else []
    return fired, next_run_at


# --- internals -------------------------------------------------------------------------------


@lru_cache(maxsize=512)
def _compile(expression: str, timezone: str) -> _Schedule:
    zone = _zone(timezone)
    if not isinstance(expression, str):
        raise CronError(f"A cron expression must be a string, got {expression!r}.")
    text = " ".join(expression.split())
    if not text:
        raise _bad(expression, f"it is empty. {_FIVE_FIELDS}")
    if text.startswith("@"):
        if text.lower() not in _ALIASES:
            raise _bad(expression, f"{text!r} is not an alias. Use one of {', '.join(_ALIASES)}")
    else:
        fields = text.split(" ")
        if len(fields) not in (5, 6):
            raise _bad(expression, f"it has {len(fields)} fields. {_FIVE_FIELDS}")
        problems = [
            problem
            for spec, value in zip(_FIELDS, fields, strict=False)
            for problem in _field_problems(spec, value)
        ]
        if problems:
            raise _bad(expression, "; ".join(problems))
        text = " ".join(_SINGLE_VALUE_RANGE.sub(r"\g<value>", value) for value in fields)
    try:
        parsed = croniter(text, _PROBE)
        hours = parsed.expanded[1]
    except (CroniterError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise _bad(expression, _croniter_problem(text, exc)) from exc
    try:
        parsed.get_next(datetime)
    except (CroniterBadDateError, OverflowError) as exc:
        raise CronError(
            f"{expression!r} never fires: no date matches it (for example February 30). "
            "Check the day and month fields."
        ) from exc
    interval = hours == ["*"] or set(hours) >= set(range(24))
    return _Schedule(expression=text, zone=zone, interval=interval)


_FIVE_FIELDS = (
    "Use five fields (minute hour day month weekday) or six with seconds last, "
    "or an alias such as '@hourly'"
)
#: croniter's aliases, each with its five fields.
_ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


@dataclass(frozen=True)
class _Field:
    """One field of an expression, for the checks croniter does not make or word well."""

    name: str
    low: int
    high: int
    size: int  # how many distinct values: a larger step can match only its start
    period: str  # what the field's values divide: a step repeats within one of these
    names: tuple[str, ...] = ()  # the names croniter accepts, worth low, low + 1...
    specials: frozenset[str] = frozenset()  # croniter's letters for this field

    @property
    def accepted(self) -> str:
        span = f"{self.low}-{self.high}"
        if self.names:
            span += f" or {self.names[0]}-{self.names[-1]}"
        if self.name == "day-of-week":
            span += ", where 0 and 7 are Sunday"
        return span


_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# In croniter's order: seconds, when present, come last.
_FIELDS = (
    _Field("minute", 0, 59, 60, "hour"),
    _Field("hour", 0, 23, 24, "day"),
    _Field("day-of-month", 1, 31, 31, "month", specials=frozenset({"l", "?"})),
    _Field("month", 1, 12, 12, "year", names=_MONTHS),
    _Field("day-of-week", 0, 7, 7, "week", names=_WEEKDAYS, specials=frozenset({"l", "?"})),
    _Field("second", 0, 59, 60, "minute"),
)
# A range of one value, with or without a step ("5-5", "mon-mon/2"): croniter (7.0) reads it
# as "*", every value, so it is rewritten as the value itself before croniter sees it.
_SINGLE_VALUE_RANGE = re.compile(r"(?<![^,])(?P<value>\w+)-(?P=value)(?:/\d+)?(?![^,])", re.I)
# One item of a comma-separated list: a value, a range or '*', and an optional step.
_ITEM = re.compile(r"(?P<start>\*|\w+)(?:-(?P<end>\w+))?(?:/(?P<step>\w*))?")


def _field_problems(spec: _Field, value: str) -> list[str]:
    """What is wrong with one field, each phrased as ``"<field> field: <problem>"``.

    Only the mistakes croniter misreports or lets through are looked for here: a number
    out of range (croniter does not say which field), a word that is not a name, and a
    step of 0 or larger than the field (croniter reads ``*/61`` in minutes as ``0``, once
    an hour, where the user asked for something a single field cannot express). A step
    equal to the field's size (``*/60`` minutes, ``*/24`` hours) is kept: it means once
    per hour or day, which is what it says. Anything else (``L``, ``5#2``, ``1W``) is
    left to croniter.
    """
    problems = []
    for item in value.lower().split(","):
        match = _ITEM.fullmatch(item)
        if match is None:
            continue  # croniter decides, and _croniter_problem names the field
        for token in (match["start"], match["end"]):
            if token is None or token == "*" or token in spec.specials:
                continue
            if token.isdigit():
                if not spec.low <= int(token) <= spec.high:
                    problems.append(
                        f"{spec.name} field: {int(token)} is out of range {spec.low}-{spec.high}"
                    )
            elif token == "h":
                problems.append(
                    f"{spec.name} field: 'H' (a hashed value) is not supported (give "
                    f"{spec.accepted})"
                )
            elif token.isalpha() and token not in spec.names:
                kind = {"month": "a month", "day-of-week": "a day of the week"}.get(
                    spec.name, "a number"
                )
                problems.append(f"{spec.name} field: {token!r} is not {kind} (use {spec.accepted})")
        step = match["step"]
        if step is None:
            continue
        if not step.isdigit():
            problems.append(f"{spec.name} field: {item!r} needs a whole number after '/'")
        elif int(step) == 0:
            problems.append(f"{spec.name} field: the step in {item!r} must be at least 1")
        elif int(step) > spec.size:
            problems.append(
                f"{spec.name} field: the step in {item!r} is larger than the field's range "
                f"{spec.low}-{spec.high if spec.name != 'day-of-week' else 6} ({spec.size} "
                f"values), so it would match once per {spec.period} only (use a step from 1 "
                f"to {spec.size})"
            )
    return problems


def _croniter_problem(text: str, exc: Exception) -> str:
    """croniter's complaint about ``text``, attributed to the field that causes it.

    croniter's messages quote the whole expression; each field is tried alone (the others
    ``*``) to name the culprit. A mistake only in how fields combine (``?`` in both day
    fields) keeps croniter's own words.
    """
    fields = text.split(" ")
    for index, value in enumerate(fields):
        alone = ["*"] * len(fields)
        alone[index] = value
        try:
            croniter(" ".join(alone), _PROBE)
        except (CroniterError, ValueError, KeyError, IndexError, TypeError):
            spec = _FIELDS[index]
            return (
                f"{spec.name} field: {value!r} is not valid (use {spec.accepted}, "
                "lists such as 1,3, ranges such as 1-5 and steps such as */2)"
            )
    return str(exc) or type(exc).__name__


def _bad(expression: str, detail: str) -> CronError:
    return CronError(f"{expression!r} is not a valid cron expression: {detail}.")


def _zone(timezone: str) -> ZoneInfo:
    if not isinstance(timezone, str) or not timezone:
        raise CronError(
            f"{timezone!r} is not an IANA time zone. Give a name such as 'Europe/Paris' or "
            "'UTC', or leave it empty to use settings.TIME_ZONE."
        )
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise CronError(
            f"{timezone!r} is not a known IANA time zone.{_closest_zone(timezone)} Use a name "
            "from zoneinfo.available_timezones(), such as 'Europe/Paris' or 'UTC' (names are "
            "case-sensitive); install the tzdata package if the system has no zone database."
        ) from exc


def _closest_zone(timezone: str) -> str:
    """``" Did you mean 'Europe/Paris'?"`` for a misspelt or miscased zone name, or ``""``."""
    zones = {name.casefold(): name for name in available_timezones()}
    match = difflib.get_close_matches(timezone.casefold(), list(zones), n=1, cutoff=0.8)
    return f" Did you mean {zones[match[0]]!r}?" if match else ""


def _aware_utc(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise CronError(f"{name} must be a datetime, got {value!r}.")
    if value.tzinfo is None or value.utcoffset() is None:
        raise CronError(
            f"{name} must be timezone-aware, got naive {value.isoformat()}. "
            "Pass the database time, or django.utils.timezone.now()."
        )
    return value.astimezone(UTC)


def _next(schedule: _Schedule, after: datetime) -> datetime:
    slot = next(_forward(schedule, after), None)
    if slot is None:
        raise CronError(f"{schedule.expression!r} never fires after {after.isoformat()}.")
    return slot


def _newest(schedule: _Schedule, low: datetime, high: datetime, count: int) -> list[datetime]:
    """Up to ``count`` newest slots in ``(low, high]``, ascending."""
    found: list[datetime] = []
    for slot in _backward(schedule, high):
        if slot <= low or len(found) == count:
            break
        found.append(slot)
    found.reverse()
    return found


def _oldest(schedule: _Schedule, low: datetime, high: datetime, count: int) -> list[datetime]:
    """Up to ``count`` oldest slots in ``(low, high]``, ascending."""
    found: list[datetime] = []
    for slot in _forward(schedule, low):
        if slot > high or len(found) == count:
            break
        found.append(slot)
    return found


def _offsets(zone: ZoneInfo, start: datetime, end: datetime) -> list[timedelta]:
    samples = []
    moment = start
    while moment < end:
        samples.append(moment)
        moment += _SAMPLE_STEP
    samples.append(end)
    return [_offset_at(zone, moment) for moment in samples]


def _offset_at(zone: ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None  # a ZoneInfo always has one
    return offset


def _whole_second(value: datetime) -> datetime:
    return value.replace(microsecond=0)


def _forward(schedule: _Schedule, after: datetime) -> Iterator[datetime]:
    """Slots strictly after ``after``, ascending and unique, lazily.

    Wall times are visited in order. Their earliest possible instant (``_resolve``'s ``low``)
    never decreases, so an instant already found that is earlier than the current wall time's
    ``low`` can never be preceded by a later discovery and is safe to yield. Only inside a
    repeated hour do instants come out of order, and the heap sorts them.
    """
    # A wall time w can map to an instant after ``after`` only if w > after + (some offset in
    # force soon after it).
    smallest = min(_offsets(schedule.zone, after, after + _SAMPLE_SPAN))
    cursor = croniter(schedule.expression, _whole_second(after + smallest))
    pending: list[datetime] = []
    previous: datetime | None = None
    while True:
        try:
            wall = cursor.get_next(datetime).replace(tzinfo=None)
        except (CroniterBadDateError, OverflowError, ValueError):
            break
        low, _high, instants = _resolve(schedule, wall)
        while pending and pending[0] < low:
            slot = heapq.heappop(pending)
            if slot > after and slot != previous:
                previous = slot
                yield slot
        for instant in instants:
            heapq.heappush(pending, instant)
    while pending:
        slot = heapq.heappop(pending)
        if slot > after and slot != previous:
            previous = slot
            yield slot


def _backward(schedule: _Schedule, until: datetime) -> Iterator[datetime]:
    """Slots at or before ``until``, descending and unique, lazily (mirror of ``_forward``)."""
    largest = max(_offsets(schedule.zone, until - _SAMPLE_SPAN, until))
    cursor = croniter(schedule.expression, _whole_second(until + largest) + _ONE_SECOND)
    pending: list[timedelta] = []  # a max-heap of instants, stored as (epoch - instant)
    previous: datetime | None = None

    def pop() -> datetime:
        return _EPOCH - heapq.heappop(pending)

    while True:
        try:
            wall = cursor.get_prev(datetime).replace(tzinfo=None)
        except (CroniterBadDateError, OverflowError, ValueError):
            break
        _low, high, instants = _resolve(schedule, wall)
        while pending and _EPOCH - pending[0] > high:
            slot = pop()
            if slot <= until and slot != previous:
                previous = slot
                yield slot
        for instant in instants:
            heapq.heappush(pending, _EPOCH - instant)
    while pending:
        slot = pop()
        if slot <= until and slot != previous:
            previous = slot
            yield slot


def _resolve(schedule: _Schedule, wall: datetime) -> tuple[datetime, datetime, list[datetime]]:
    """Map a naive local wall time to ``(low, high, instants)``, all aware UTC.

    ``instants`` are the slot's fire instants under the DST rules. ``low`` and ``high`` bound
    every instant the wall time could denote whatever the rules (both occurrences of a repeated
    time, the end of a gap); both are non-decreasing in the wall time, which is what lets
    ``_forward`` and ``_backward`` yield in order.
    """
    zone = schedule.zone
    before = wall.replace(tzinfo=zone, fold=0).utcoffset()  # offset before a transition
    after = wall.replace(tzinfo=zone, fold=1).utcoffset()  # offset after it
    assert before is not None and after is not None
    naive_first = wall - before
    first = naive_first.replace(tzinfo=UTC)
    if before == after:  # an ordinary wall time
        return first, first, [first]
    second = (wall - after).replace(tzinfo=UTC)
    if before > after:  # clocks went back: the wall time happens twice, first < second
        return first, second, [first, second] if schedule.interval else [first]
    # Clocks went forward: the wall time does not exist; second < transition <= first.
    transition = _transition(zone, second, first, after)
    return transition, transition, [] if schedule.interval else [transition]


def _transition(zone: ZoneInfo, low: datetime, high: datetime, offset: timedelta) -> datetime:
    """The first instant in ``(low, high]`` whose offset is ``offset``, to the second.

    ``low`` is before the transition and ``high`` after it; transitions are on whole seconds.
    """
    low, high = _whole_second(low), _whole_second(high)
    while high - low > _ONE_SECOND:
        middle = _whole_second(low + (high - low) / 2)
        if _offset_at(zone, middle) == offset:
            high = middle
        else:
            low = middle
    return high
