"""The cron scheduler and leadership, on the real database and real processes."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.core import checks
from django.test import override_settings

from django_dispatch import store
from django_dispatch.core import cron
from django_dispatch.models import CronEntry, Job, Leadership
from django_dispatch.runtime import scheduler
from django_dispatch.services import run_cron_entry_now, set_cron_enabled
from tests.concurrency import run_concurrently
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "tests.testapp.tasks.add"
MINUTELY = {"schedule": "* * * * *", "task": "tests.testapp.tasks.add", "args": [1, 2]}


def entry(name="e", **fields) -> CronEntry:
    values = {
        "schedule": "* * * * *",
        "timezone": "UTC",
        "task_path": "tests.testapp.tasks.add",
        "args": [1, 2],
        **fields,
    }
    return CronEntry.objects.create(name=name, **values)


def db_now():
    return store.db_now("default")


def test_sync_creates_updates_and_disables_settings_entries():
    with override_settings(DISPATCH={"CRON": {"a": MINUTELY, "b": {**MINUTELY, "args": [0, 0]}}}):
        scheduler.sync_from_settings()
    admin_made = entry("from-admin")
    assert set(CronEntry.objects.values_list("name", flat=True)) == {"a", "b", "from-admin"}
    a = CronEntry.objects.get(name="a")
    assert a.source == "settings" and a.timezone == "UTC" and a.args == [1, 2]
    CronEntry.objects.filter(name="a").update(last_slot=db_now() - timedelta(days=1))
    with override_settings(DISPATCH={"CRON": {"a": {**MINUTELY, "schedule": "*/5 * * * *"}}}):
        scheduler.sync_from_settings()
    a = CronEntry.objects.get(name="a")
    assert a.schedule == "*/5 * * * *"
    assert a.last_slot is None and a.next_run_at is None  # no replay of a day of slots
    assert CronEntry.objects.get(name="b").enabled is False  # removed: disabled, kept
    assert CronEntry.objects.get(pk=admin_made.pk).enabled is True  # admin entries untouched


def test_a_new_entry_fires_nothing_for_the_past_then_each_slot_once():
    e = entry()
    assert scheduler.tick() == 0  # schedules itself
    e.refresh_from_db()
    assert e.next_run_at > db_now() - timedelta(seconds=1) and e.last_slot is not None
    # Pretend the next slot has come: move the watermark one minute back.
    CronEntry.objects.filter(pk=e.pk).update(
        last_slot=e.last_slot - timedelta(minutes=1), next_run_at=db_now() - timedelta(seconds=1)
    )
    assert scheduler.tick() == 1
    assert scheduler.tick() == 0  # not due again
    job = Job.objects.get()
    assert job.idempotency_key == f"cron:e:{e.last_slot.isoformat()}"
    assert job.args == [1, 2] and job.task_path == "tests.testapp.tasks.add"


@pytest.mark.parametrize(("policy", "expected"), [("skip", 0), ("latest", 1), ("all", 5)])
def test_misfire_policies_after_five_missed_intervals(policy, expected):
    now = db_now()
    # Hourly, at a minute half an hour away from now: every missed slot is far
    # outside the grace window, whenever the test runs.
    schedule = f"{(now.minute + 30) % 60} * * * *"
    latest = cron.latest_slot(schedule, "UTC", now)
    last = latest - timedelta(hours=5)
    entry(
        schedule=schedule,
        misfire_policy=policy,
        last_slot=last,
        next_run_at=last + timedelta(hours=1),
    )
    assert scheduler.tick() == expected
    assert Job.objects.count() == expected
    e = CronEntry.objects.get()
    assert e.next_run_at > now and e.last_slot >= latest


def test_concurrent_ticks_fire_each_slot_once():
    now = db_now()
    schedule = f"{(now.minute + 30) % 60} * * * *"  # no slot near now: exactly 3 missed
    last = cron.latest_slot(schedule, "UTC", now) - timedelta(hours=3)
    for i in range(10):
        entry(f"e{i}", schedule=schedule, misfire_policy="all", last_slot=last, next_run_at=last)
    fired = run_concurrently(*[scheduler.tick] * 4, together=True)  # re-raises their errors
    assert sum(fired) == 30 == Job.objects.count()
    assert Job.objects.values("idempotency_key").distinct().count() == 30


def test_cron_jobs_send_task_enqueued_after_commit_off_the_loop_thread():
    from django_dispatch.compat import task_enqueued

    seen: list[tuple[str, str]] = []

    def receiver(sender, task_result, **kwargs):
        seen.append((task_result.id, threading.current_thread().name))

    e = entry()
    scheduler.tick()
    CronEntry.objects.filter(pk=e.pk).update(
        last_slot=CronEntry.objects.get(pk=e.pk).last_slot - timedelta(minutes=1),
        next_run_at=db_now() - timedelta(seconds=1),
    )
    task_enqueued.connect(receiver)
    try:
        assert scheduler.tick() == 1
        wait_until(lambda: seen, what="task_enqueued for the cron job")
    finally:
        task_enqueued.disconnect(receiver)
    ((job_id, thread),) = seen
    assert Job.objects.filter(pk=job_id).exists()
    assert thread != threading.current_thread().name


def test_run_now_does_not_disturb_the_schedule_and_disabled_entries_do_not_fire():
    e = entry()
    scheduler.tick()
    e.refresh_from_db()
    result = run_cron_entry_now(e.pk)
    assert Job.objects.get(pk=result.id).args == [1, 2]
    assert CronEntry.objects.get(pk=e.pk).next_run_at == e.next_run_at
    set_cron_enabled([e.pk], False)
    CronEntry.objects.filter(pk=e.pk).update(
        next_run_at=db_now() - timedelta(seconds=1) - timedelta(minutes=1)
    )
    assert scheduler.tick() == 0


def test_a_broken_entry_never_breaks_the_tick():
    good = entry("good")
    entry("broken", task_path="tests.testapp.tasks.does_not_exist")
    scheduler.tick()
    CronEntry.objects.update(
        last_slot=db_now() - timedelta(minutes=1), next_run_at=db_now() - timedelta(seconds=1)
    )
    assert scheduler.tick() == 1
    assert Job.objects.get().idempotency_key.startswith(f"cron:{good.name}:")


def test_system_check_rejects_bad_settings_entries():
    bad = {
        "bad-schedule": {**MINUTELY, "schedule": "61 * * * *"},
        "bad-zone": {**MINUTELY, "timezone": "Mars/Olympus"},
        "bad-task": {**MINUTELY, "task": "tests.testapp.tasks.not_a_task"},
        "bad-policy": {**MINUTELY, "misfire_policy": "sometimes"},
        "bad-args": {**MINUTELY, "args": 5, "priority": 500},
    }
    with override_settings(DISPATCH={"CRON": bad}):
        ids = sorted(m.id for m in checks.run_checks() if m.id.startswith("django_dispatch"))
    assert ids == [
        "django_dispatch.E031",
        "django_dispatch.E031",
        "django_dispatch.E032",
        "django_dispatch.E033",
        "django_dispatch.E034",
        "django_dispatch.E034",
    ]
    # A worker syncing such settings skips the bad entry instead of crashing.
    with override_settings(DISPATCH={"CRON": {"bad-args": bad["bad-args"], "ok": MINUTELY}}):
        scheduler.sync_from_settings()
    assert list(CronEntry.objects.values_list("name", flat=True)) == ["ok"]


# --- leadership -----------------------------------------------------------------


def test_one_leader_at_a_time_and_takeover_after_expiry():
    assert store.leadership_acquire("a", ttl=30)
    assert not store.leadership_acquire("b", ttl=30)
    assert store.leadership_acquire("a", ttl=30)  # renewal
    Leadership.objects.update(expires_at=db_now() - timedelta(seconds=1))
    assert store.leadership_acquire("b", ttl=30)  # takeover
    assert not store.leadership_acquire("a", ttl=30)
    store.leadership_release("b")
    assert store.leadership_acquire("a", ttl=30)


def test_a_released_lease_is_free_in_the_same_clock_tick():
    """A lease is valid while ``expires_at > now``, so expired at ``now`` itself.

    SQLite's clock ticks in milliseconds: a release and the next acquire
    often read the same instant, and a takeover asking ``expires_at < now``
    refused a lease released a moment before (a flaky CI failure).
    """
    for round_ in range(50):
        holder, other = ("a", "b") if round_ % 2 else ("b", "a")
        assert store.leadership_acquire(holder, ttl=30)
        store.leadership_release(holder)
        assert store.leadership_acquire(other, ttl=30), f"round {round_}"
        store.leadership_release(other)


@pytest.mark.slow
def test_leader_killed_the_other_worker_takes_over(start_worker):
    first = start_worker("--concurrency", "1", "--worker-id", "first")
    wait_until(lambda: Leadership.objects.filter(holder="first").exists(), what="first leads")
    second = start_worker("--concurrency", "1", "--worker-id", "second")
    time.sleep(1)
    assert Leadership.objects.get().holder == "first"  # a live leader keeps it
    first.signal(signal.SIGKILL)
    first.wait()
    wait_until(
        lambda: Leadership.objects.filter(holder="second").exists(),
        timeout=15,
        what="second to take over after the 2 s lease expires",
    )
    second.signal(signal.SIGTERM)
    assert second.wait() == 0


@pytest.mark.slow
def test_three_schedulers_fire_every_second_exactly_once_even_when_one_dies(start_worker):
    every_second = {
        "schedule": "* * * * * *",
        "task": "tests.testapp.tasks.add",
        "args": [1, 1],
        "timezone": "UTC",
    }
    overrides = {"CRON": {"tick": every_second}, "SCHEDULER_INTERVAL": 0.2}
    workers = [start_worker("--concurrency", "2", overrides=overrides) for _ in range(3)]
    wait_until(lambda: Job.objects.exists(), what="the first fire")
    time.sleep(10)  # 20 seconds of per-second fires, one scheduler killed halfway
    workers[0].signal(signal.SIGKILL)
    workers[0].wait()
    time.sleep(10)
    for w in workers[1:]:
        w.signal(signal.SIGTERM)
    for w in workers[1:]:
        assert w.wait() == 0, w.output()

    keys = list(Job.objects.values_list("idempotency_key", flat=True))
    assert len(keys) == len(set(keys)), "a slot fired twice"
    slots = sorted(
        time.mktime(time.strptime(k.split(":", 2)[2][:19], "%Y-%m-%dT%H:%M:%S")) for k in keys
    )
    assert len(slots) >= 19
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert set(gaps) == {1.0}, f"missing seconds: {gaps}"


# --- what a worker logs when it syncs settings the checks would refuse ---------------------


@pytest.mark.django_db
def test_a_worker_skips_an_invalid_cron_entry_with_a_clear_log(caplog):
    from django_dispatch.models import CronEntry
    from django_dispatch.store.schedules import cron_sync_from_settings

    entries = {
        "no-task": {"schedule": "0 3 * * *"},
        "bad-args": {"schedule": "0 3 * * *", "task": ADD, "args": 5},
        "ok": {"schedule": "0 3 * * *", "task": ADD},
    }
    with caplog.at_level("ERROR", logger="django_dispatch.scheduler"):
        assert cron_sync_from_settings(entries, default_timezone="UTC") == (1, 0, 0)
    assert [r.getMessage() for r in caplog.records] == [
        "DISPATCH['CRON']['no-task'] was skipped: it has no 'task' key. Run `manage.py check` "
        "for every problem in DISPATCH.",
        "DISPATCH['CRON']['bad-args'] was skipped: a value has the wrong type ('int' object "
        "is not iterable). Run `manage.py check` for every problem in DISPATCH.",
    ]
    assert list(CronEntry.objects.values_list("name", flat=True)) == ["ok"]
