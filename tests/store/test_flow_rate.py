"""Rate limits (issue #17, item 3): @task(rate_limit="N/period"), starts per
fixed window counted in the database across workers; a job over the limit
waits (blocked, no attempt spent) until a window has room."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.db.models import DateTimeField, Value
from django.utils import timezone

from django_dispatch import store
from django_dispatch.compat import InvalidTask
from django_dispatch.core.rates import parse_rate
from django_dispatch.core.states import JobState
from django_dispatch.models import ConcurrencyWait, Job
from django_dispatch.runtime import flow_cache
from django_dispatch.store.gates.limits import ConcurrencyGate, window_start
from django_dispatch.store.types import CLAIM_FIELDS
from tests.conftest import wait_until
from tests.store.helpers import claim_as_worker
from tests.testapp import flow_tasks, tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_flow_cache():

    flow_cache.forget_paused()


def claim(limit=10):
    return claim_as_worker(limit=limit)


@pytest.mark.parametrize(
    "rate, parsed",
    [("100/m", (100, 60)), ("10/5s", (10, 5)), (" 3 / 2 h ", (3, 7200)), ("1/d", (1, 86400))],
)
def test_rates_parse(rate, parsed):
    assert parse_rate(rate) == parsed


@pytest.mark.parametrize("rate", ["", "10", "0/s", "10/0s", "10/w", "ten/s", "-1/s", None, 5])
def test_bad_rates_say_what_is_accepted(rate):
    with pytest.raises(ValueError, match="'N/unit'"):
        parse_rate(rate)


def test_a_bad_rate_is_refused_at_definition():
    from django_dispatch import task

    with pytest.raises(InvalidTask, match="does not parse"):
        task(rate_limit="fast")(tasks.add.func)


def test_windows_are_aligned_on_the_epoch():
    now = datetime(2026, 1, 1, 12, 0, 7, 500000, tzinfo=UTC)
    assert window_start(now, 5) == datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)
    assert window_start(now, 60) == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_a_claim_counts_the_window_its_leases_are_stamped_in():
    """A claim stamps its leases with the clock it read with its candidates
    (``db_now``); the window's starts are counted at that clock too. Read
    again, near a window's end, the clock could fall in the next window, whose
    empty count let the claim add its starts, stamped in this one, to a full
    window (23 starts in a second under a 20/s limit)."""
    db = store.db_alias()
    full = [flow_tasks.rated_slowly.enqueue(f"f{i}") for i in range(3)]
    late = flow_tasks.rated_slowly.enqueue("late")
    stamp = window_start(store.db_now(db), 2) - timedelta(seconds=0.2)  # the previous window
    Job.objects.filter(pk__in=[r.id for r in full]).update(
        state=JobState.RUNNING, last_attempted_at=stamp
    )
    rows = list(
        Job.objects.filter(pk=late.id)
        .annotate(db_now=Value(stamp, output_field=DateTimeField()))
        .values(*CLAIM_FIELDS, "db_now")
    )
    with transaction.atomic(using=db):
        admitted, _, blocked = ConcurrencyGate(db, "").sort(rows, 1)
    assert (admitted, blocked) == ([], 1)


def test_over_the_limit_a_job_waits_without_spending_an_attempt():
    jobs = [flow_tasks.rated_slowly.enqueue(f"r{i}") for i in range(5)]
    # start right after a window boundary, so the whole test stays in one window
    wait_until(lambda: time.time() % 2 < 0.2, timeout=3, what="a window boundary")
    first = claim()
    assert len(first) == 3
    assert claim() == []  # finishing does not matter for a rate: the window is full
    for c in first:
        store.job_finish_if_leased(c.lease, None)
    assert claim() == []
    waiting = Job.objects.filter(pk__in=[r.id for r in jobs], state=JobState.BLOCKED)
    assert waiting.count() == 2 and {j.attempts for j in waiting} == {0}
    wait = ConcurrencyWait.objects.get()
    assert (wait.rate_limit, wait.rate_period, wait.limit) == (3, 2, None)
    wait_until(lambda: (time.time() % 2 < 1.0 and claim()) or None, timeout=4, what="next window")
    assert Job.objects.filter(state=JobState.BLOCKED).count() == 0


def test_three_workers_hold_twenty_per_second_and_reach_it(start_worker):
    """rate_limit="20/s" with 3 workers x 4 threads: starts (the claim's time,
    Job.started_at, database clock) per one-second window never exceed 20, and
    every full second in between sees at least 18 (90%)."""
    for i in range(140):
        flow_tasks.rated.enqueue(f"x{i}")
    for _ in range(3):
        start_worker("--concurrency", "4", overrides={"POLL_INTERVAL": 0.05})
    wait_until(
        lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == 140,
        timeout=30,
        what="every rated job to run",
    )
    starts = Counter(int(t.timestamp()) for t in Job.objects.values_list("started_at", flat=True))
    assert max(starts.values()) <= 20, sorted(starts.items())
    seconds = sorted(starts)
    full = seconds[1:-1]  # the first and last windows are partial
    assert len(full) >= 5
    slow = {s: starts[s] for s in full if starts[s] < 18}
    assert not slow, f"windows below 90% of the limit: {slow} of {sorted(starts.items())}"


def test_with_a_concurrency_key_the_rate_is_per_key():
    for key in ("A", "B"):
        for i in range(4):
            flow_tasks.rated_slowly.using(concurrency_key=key).enqueue(f"{key}{i}")
    wait_until(lambda: time.time() % 2 < 0.2, timeout=3, what="a window boundary")
    claimed = claim()
    per_key = Counter(Job.objects.get(pk=c.id).concurrency_key for c in claimed)
    assert per_key == {"A": 3, "B": 3}
    assert ConcurrencyWait.objects.count() == 2


def test_deferred_jobs_of_the_group_hold_no_starts():
    """Review finding (wave 5): promotion counted every pending job of a rated
    group against the window, so jobs deferred to tomorrow filled every
    window and the group's blocked jobs waited until they ran."""
    group = flow_tasks.rated_slowly.using(concurrency_key="customer:42")
    tomorrow = timezone.now() + timedelta(days=1)
    deferred = [group.using(run_after=tomorrow).enqueue(f"d{i}") for i in range(3)]
    wait_until(lambda: time.time() % 2 < 0.2, timeout=3, what="a window boundary")
    for i in range(4):
        group.enqueue(f"a{i}")
    first = claim()
    assert len(first) == 3  # the window is full: the fourth is set aside
    for c in first:
        store.job_finish_if_leased(c.lease, None)
    assert Job.objects.filter(state=JobState.BLOCKED).count() == 1
    wait_until(lambda: claim() or None, timeout=5, what="the next window to start the fourth")
    assert Job.objects.filter(state=JobState.BLOCKED).count() == 0
    assert set(
        Job.objects.filter(pk__in=[d.id for d in deferred]).values_list("state", flat=True)
    ) == {JobState.SCHEDULED}  # still waiting for tomorrow, out of the claim index
