"""Which database an admin page's bulk action and add form, a service called
with no alias, and ``assert_enqueued`` act on, when an alias has a database of
its own. Ids are per database: each test makes the same id exist on both, so a
call reaching the wrong database acts on another row instead of failing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from django_dispatch import cancel, retry_now, store
from django_dispatch.core.states import JobState
from django_dispatch.models import CronEntry, DeadLetter, Job
from django_dispatch.testing import assert_enqueued, drain
from tests.testapp import tasks

from .conftest import EU_DB, two_databases

pytestmark = [
    two_databases,
    pytest.mark.django_db(transaction=True, reset_sequences=True, databases=["default", EU_DB]),
    pytest.mark.usefixtures("eu_alias"),
]

LATER = timedelta(hours=1)
RECORD = "tests.testapp.tasks.record"


def test_replay_all_matching_under_an_alias_replays_that_database_letters(admin_client):
    for i in range(3):
        tasks.fail_always.using(backend="eu").enqueue(f"eu{i}")
    tasks.fail_always.enqueue("default")  # dead letter 1 on default too: same id as eu's first
    assert drain(backend="eu") == 3 and drain() == 1
    bulk = reverse("admin:django_dispatch_deadletter_bulk")
    confirm = admin_client.get(bulk, {"alias": "eu", "replayed": "no"}).content.decode()
    assert 'id="dispatch-bulk-count">3<' in confirm
    response = admin_client.post(bulk + "?alias=eu&replayed=no")
    assert response.status_code == 302
    assert DeadLetter.objects.using(EU_DB).filter(replayed_at__isnull=True).count() == 0
    assert DeadLetter.objects.using("default").get().replayed_at is None  # its namesake


def test_an_object_added_under_an_alias_is_validated_and_saved_on_its_database(admin_client):
    add = reverse("admin:django_dispatch_cronentry_add") + "?alias=eu"
    form = {
        "name": "nightly",
        "namespace": "eu",
        "schedule": "0 3 * * *",
        "timezone": "UTC",
        "task_path": "tests.testapp.tasks.noop",
        "args": "[]",
        "kwargs": "{}",
        "queue_name": "default",
        "priority": "0",
        "misfire_policy": "skip",
        "enabled": "on",
    }
    assert admin_client.post(add, form).status_code == 302
    assert CronEntry.objects.using(EU_DB).get().name == "nightly"
    assert not CronEntry.objects.using("default").exists()
    # The same name again: refused by the form, checked where the entry is.
    again = admin_client.post(add, form)
    assert again.status_code == 200 and again.context["adminform"].form.errors
    assert CronEntry.objects.using(EU_DB).count() == 1
    assert not CronEntry.objects.using("default").exists()


def test_a_service_named_no_alias_in_an_alias_worker_acts_on_the_default_database():
    """A task running in the ``eu`` worker enqueues a ``default`` job and cancels
    it: the job is on the default alias's database, not the served one."""
    later = timezone.now() + LATER
    theirs = tasks.record.using(backend="eu", run_after=later).enqueue("eu")
    store.serve_database(EU_DB)  # as ``rundispatch --backend eu`` does
    try:
        mine = tasks.record.using(run_after=later).enqueue("default")
        assert mine.id == theirs.id and Job.objects.using("default").filter(pk=mine.id).exists()
        assert cancel(mine.id) is True
        assert retry_now(mine.id) is False  # cancelled: nothing to retry
        assert_enqueued(RECORD, count=0)
        with store.using_backend("eu"):  # an explicit block still wins
            assert_enqueued(RECORD, count=1)
    finally:
        store.serve_database(None)
    assert Job.objects.using("default").get().state == JobState.CANCELLED
    assert Job.objects.using(EU_DB).get().state != JobState.CANCELLED


def test_assert_enqueued_reads_the_database_of_the_using_backend_block():
    tasks.record.using(backend="eu").enqueue("eu")
    assert_enqueued(RECORD, count=0)
    with store.using_backend("eu"):
        assert [j.args for j in assert_enqueued(RECORD, count=1)] == [["eu"]]
