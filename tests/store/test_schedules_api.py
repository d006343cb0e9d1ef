"""schedules.save/delete/set_enabled/get/list: cron entries made in code, checked
before anything is written, left alone by the settings sync, and fired by the
ordinary scheduler (one job per slot, whatever the number of ticks)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from django_dispatch import schedules, store
from django_dispatch.models import CronEntry, Job
from django_dispatch.runtime import scheduler
from tests.concurrency import run_concurrently
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "tests.testapp.tasks.add"
MINUTELY = {"schedule": "* * * * *", "task": ADD, "args": [1, 2]}


def db_now():
    return store.db_now("default")


def test_save_creates_then_updates_by_name_and_get_list_read_back():
    made = schedules.save("report", schedule="0 3 * * *", task=tasks.echo, args=["x"])
    assert (made.source, made.task_path, made.args, made.kwargs) == (
        "code",
        tasks.echo.module_path,
        ["x"],
        {},
    )
    assert (made.queue_name, made.priority, made.timezone, made.enabled) == (
        "emails",
        5,
        "UTC",
        True,
    )
    CronEntry.objects.filter(pk=made.pk).update(last_slot=db_now() - timedelta(days=2))
    again = schedules.save(
        "report",
        schedule="0 4 * * *",
        task=ADD,
        args=(1,),
        kwargs={"b": 2},
        timezone="Europe/Paris",
    )
    assert again.pk == made.pk and again.task_path == ADD and again.kwargs == {"b": 2}
    assert again.last_slot is None and again.next_run_at is None  # a new schedule starts afresh
    schedules.save("another", schedule="@hourly", task=ADD, args=[1, 2], enabled=False)
    assert [e.name for e in schedules.list()] == ["another", "report"]
    assert schedules.get("report").schedule == "0 4 * * *"
    assert schedules.get("nope") is None


def test_the_settings_sync_never_touches_code_entries_and_names_it_owns_are_refused():
    schedules.save("mine", schedule="*/5 * * * *", task=ADD, args=[1, 2])
    with override_settings(DISPATCH={"CRON": {"theirs": MINUTELY}}):
        scheduler.sync_from_settings()
        with pytest.raises(ValueError, match=r"'theirs' is defined in DISPATCH\['CRON'\]"):
            schedules.save("theirs", schedule="* * * * *", task=ADD, args=[1, 2])
        with pytest.raises(ValueError, match="next worker start would undo a delete"):
            schedules.delete("theirs")
        with pytest.raises(ValueError, match="next worker start would undo a disable"):
            schedules.set_enabled("theirs", False)
        assert schedules.get("theirs").enabled  # refused, nothing written
    mine = CronEntry.objects.get(name="mine")
    assert (mine.enabled, mine.schedule, mine.source) == (True, "*/5 * * * *", "code")
    # A name added to the settings after code made it: the code keeps it.
    with override_settings(DISPATCH={"CRON": {"mine": MINUTELY}}):
        scheduler.sync_from_settings()
    assert CronEntry.objects.get(name="mine").schedule == "*/5 * * * *"
    assert schedules.get("theirs").source == "settings"


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"schedule": "61 * * * *"}, ValueError, "schedule: '61 * * * *' is not a valid cron"),
        ({"schedule": ""}, ValueError, "schedule must be a cron expression"),
        ({"timezone": "Europe/Pariss"}, ValueError, "timezone: 'Europe/Pariss' is not a known"),
        (
            {"task": "tests.testapp.tasks.nope"},
            ValueError,
            "task 'tests.testapp.tasks.nope' cannot",
        ),
        ({"task": "tests.testapp.tasks.quick_backoff"}, ValueError, "is a function, not a Task"),
        ({"task": 3}, TypeError, "task must be a Task or its import path"),
        ({"args": [1]}, TypeError, "args/kwargs do not fit the task"),
        ({"args": "12"}, TypeError, "args must be a list or tuple"),
        ({"args": [1, {2}]}, TypeError, "args must be JSON"),
        ({"kwargs": [1]}, TypeError, "kwargs must be a dict"),
        ({"enabled": "yes"}, TypeError, "enabled must be True or False"),
        ({"name": ""}, ValueError, "name must be a non-empty string"),
        ({"backend": "nope"}, ValueError, "TASKS has no DispatchBackend alias 'nope'"),
    ],
)
def test_a_bad_argument_is_named_and_nothing_is_written(fields, error, message):
    call = {"name": "bad", "schedule": "* * * * *", "task": ADD, "args": [1, 2], **fields}
    name = call.pop("name")
    with pytest.raises(error) as caught:
        schedules.save(name, **call)
    assert message in str(caught.value)
    assert not CronEntry.objects.exists()


def test_delete_and_set_enabled_say_whether_they_changed_it():
    schedules.save("e", schedule="* * * * *", task=ADD, args=[1, 2])
    assert schedules.set_enabled("e", True) is False  # already enabled
    assert schedules.set_enabled("e", False) is True and not schedules.get("e").enabled
    assert schedules.set_enabled("missing", True) is False
    with pytest.raises(TypeError, match="next_run_at must be an aware datetime"):
        schedules.set_enabled("e", True, next_run_at=db_now().replace(tzinfo=None))
    with pytest.raises(ValueError, match="pass enabled=True"):
        schedules.set_enabled("e", False, next_run_at=db_now())
    assert not schedules.get("e").enabled  # the refused calls wrote nothing
    assert schedules.delete("e") is True and schedules.delete("e") is False


def test_set_enabled_with_next_run_at_fires_first_at_that_instant_then_on_the_schedule():
    schedules.save("daily", schedule="0 3 * * *", task=ADD, args=[1, 2], enabled=False)
    later = db_now() + timedelta(hours=1)
    assert schedules.set_enabled("daily", True, next_run_at=later) is True
    assert scheduler.tick() == 0  # not yet: due at that instant
    assert schedules.get("daily").next_run_at == later
    first = db_now() - timedelta(seconds=1)  # due now
    schedules.set_enabled("daily", True, next_run_at=first)
    fired = run_concurrently(*[scheduler.tick] * 3, together=True)  # three schedulers
    assert sum(fired) == 1
    (job,) = Job.objects.all()
    assert job.idempotency_key == f"cron:daily:{first.isoformat()}"
    entry = schedules.get("daily")
    assert entry.last_run_at == first
    assert entry.next_run_at > db_now() and (entry.next_run_at.hour, entry.next_run_at.minute) == (
        3,
        0,
    )
    assert scheduler.tick() == 0 and Job.objects.count() == 1  # then the schedule: 03:00


def test_a_task_whose_queue_its_backend_refuses_cannot_be_scheduled(settings):
    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": ["default"]}}
    with pytest.raises(ValueError) as caught:
        schedules.save("mail", schedule="* * * * *", task=tasks.echo, args=["x"])
    assert str(caught.value).startswith(
        "task tests.testapp.tasks.echo cannot be scheduled: Task tests.testapp.tasks.echo "
        "uses queue 'emails', which TASKS['default']['QUEUES'] does not list"
    )
    assert not CronEntry.objects.exists()


def test_the_admin_shows_where_each_entry_comes_from(admin_client):
    schedules.save("from-code", schedule="* * * * *", task=ADD, args=[1, 2])
    CronEntry.objects.create(name="from-admin", schedule="* * * * *", timezone="UTC", task_path=ADD)
    with override_settings(DISPATCH={"CRON": {"from-settings": MINUTELY}}):
        scheduler.sync_from_settings()
    page = admin_client.get("/admin/django_dispatch/cronentry/").content.decode()
    for name, origin in [
        ("from-code", "Code (schedules.save)"),
        ("from-admin", "Admin"),
        ("from-settings", "DISPATCH[&#x27;CRON&#x27;] setting"),
    ]:
        row = page[page.index(f">{name}<") :].split("</tr>", 1)[0]
        assert origin in row, (name, row)
    filtered = admin_client.get("/admin/django_dispatch/cronentry/?source__exact=code")
    assert "from-code" in filtered.content.decode()
    assert "from-admin" not in filtered.content.decode()
