"""Operators' reads come from a real streaming replica; writes and the reads that decide
them never do; a replica stopped or far behind sends reads back to the primary.

The proof that a read was served by the replica: its replay is paused
(``pg_wal_replay_pause()``), rows are written on the primary, and the read shows the
replica's older state while the primary has more. The proof that something never
touches the replica: no query at all on its connection while it runs (the replica
is a hot standby besides, where any write fails).
"""

from __future__ import annotations

import socket
import time

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_dispatch import dead_letters, jobs, run_now, schedules, services, workflows
from django_dispatch.models import Job
from django_dispatch.queries import reading
from django_dispatch.states import JobState
from tests.conftest import wait_until
from tests.testapp import tasks

pytestmark = [
    pytest.mark.replica,
    pytest.mark.django_db(transaction=True, databases=["default", "replica"]),
]


def ids(rows) -> set[int]:
    return {row.pk for row in rows}


def overview(client) -> str:
    response = client.get(reverse("admin:django_dispatch_job_overview"))
    assert response.status_code == 200
    return response.content.decode()


def changelist(client) -> str:
    response = client.get(reverse("admin:django_dispatch_job_changelist"))
    assert response.status_code == 200
    return response.content.decode()


def test_the_list_functions_read_the_replica_and_see_a_row_once_replayed(replica):
    first = tasks.add.enqueue(1, 2)
    replica.caught_up()
    assert reading.health().used == "replica"
    assert ids(jobs.list()) == {int(first.id)}

    replica.pause()
    second = tasks.add.enqueue(3, 4)
    schedules.save("nightly", schedule="0 3 * * *", task=tasks.noop)
    # The primary has both jobs and the entry; the replica, replay paused, does not.
    assert Job.objects.using("default").count() == 2
    assert ids(jobs.list()) == {int(first.id)}
    assert jobs.count() == 1
    assert jobs.count(state=JobState.PENDING) == 1
    assert schedules.get("nightly") is None
    assert schedules.list() == []
    assert dead_letters.count() == 0 and workflows.count_runs() == 0

    replica.resume()
    wait_until(lambda: jobs.count() == 2, what="the second job replayed")
    assert ids(jobs.list()) == {int(first.id), int(second.id)}
    assert schedules.get("nightly") is not None
    assert [entry.name for entry in schedules.list()] == ["nightly"]


def test_writes_claims_and_admin_actions_never_touch_the_replica(replica, admin_client):
    replica.pause()  # whatever reached the replica now would be missing there
    with CaptureQueriesContext(connections["replica"]) as on_replica:
        cancelled = tasks.add.enqueue(1, 1)
        ran = tasks.add.enqueue(2, 3)
        failed = tasks.fail_always.enqueue()
        assert run_now(ran.id)
        assert run_now(failed.id)
        # The changelist's action: its selection is read on the primary, which has
        # the job the paused replica does not.
        data = {"action": "cancel_jobs", "_selected_action": [cancelled.id], "index": "0"}
        admin_client.post(reverse("admin:django_dispatch_job_changelist"), data)
        letter = dead_letters.for_job(failed.id)
        assert letter is not None
        assert services.replay(letter.pk, replayed_by="ops") is not None
    assert on_replica.captured_queries == []
    states = dict(Job.objects.using("default").values_list("pk", "state"))
    assert states[int(cancelled.id)] == JobState.CANCELLED
    assert states[int(ran.id)] == JobState.SUCCEEDED
    assert states[int(failed.id)] == JobState.FAILED
    assert len(states) == 4  # the replay's new job
    # The operators' reads meanwhile see the replica's state of before all that.
    assert jobs.count() == 0


def test_the_console_and_the_changelist_read_the_replica_and_say_how_far_behind(
    replica, admin_client
):
    tasks.add.enqueue(1, 1)
    replica.caught_up()
    page = overview(admin_client)
    assert 'data-reads="ok"' in page and "Read from the replica <code>replica</code>" in page
    assert 'data-count="pending">1<' in page

    replica.pause()
    hidden = tasks.add.enqueue(2, 2)
    reading.forget()
    page = overview(admin_client)
    assert 'data-reads="ok"' in page
    assert 'data-count="pending">1<' in page  # the replica's count: the primary has 2
    assert f"/job/{hidden.id}/change/" not in changelist(admin_client)
    # The change page (and anything that may act) reads the primary.
    change = admin_client.get(reverse("admin:django_dispatch_job_change", args=[hidden.id]))
    assert change.status_code == 200


def test_a_stopped_replica_sends_reads_to_the_primary_and_the_console_says_so(
    replica, admin_client
):
    replica.pause()
    newer = tasks.add.enqueue(5, 5)
    assert jobs.count() == 0
    replica.stop()
    reading.forget()
    started = time.monotonic()
    verdict = reading.health()
    assert time.monotonic() - started < reading.PROBE_TIMEOUT + 1
    assert (verdict.state, verdict.used, verdict.fallback) == ("down", "default", True)
    assert ids(jobs.list()) == {int(newer.id)}
    assert jobs.count() == 1
    page = overview(admin_client)
    assert 'data-reads="down"' in page
    assert "this page reads from the primary <code>default</code>" in page
    assert 'data-count="pending">1<' in page
    assert f"/job/{newer.id}/change/" in changelist(admin_client)

    replica.start()
    reading.forget()
    replica.caught_up()
    assert reading.health().used == "replica"
    assert jobs.count() == 1


def test_a_replica_further_behind_than_read_max_lag_sends_reads_to_the_primary(
    replica, admin_client, settings
):
    tasks.add.enqueue(1, 1)
    replica.caught_up()
    replica.pause()
    tasks.add.enqueue(2, 2)
    settings.DISPATCH = {**settings.DISPATCH, "READ_MAX_LAG": 0.2}
    wait_until(
        lambda: reading.forget() or reading.health().state == "lagging",
        what="the paused replica to lag over READ_MAX_LAG",
    )
    verdict = reading.health()
    assert verdict.used == "default" and verdict.lag is not None and verdict.lag > 0.2
    assert verdict.behind_bytes and verdict.behind_bytes > 0
    assert jobs.count() == 2
    page = overview(admin_client)
    assert 'data-reads="lagging"' in page and "more than READ_MAX_LAG (0.2 s)" in page

    replica.resume()
    replica.caught_up()
    reading.forget()
    assert reading.health().state == "ok" and jobs.count() == 2


def test_a_replica_that_never_answers_costs_a_page_the_probe_timeout_not_a_hang(
    replica, admin_client
):
    """A replica host that accepts the TCP connection and then says nothing (a hung
    server, a half-dead network path): the probe gives up at its connect timeout."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes handshakes; nobody ever answers
    settings_dict = connections["replica"].settings_dict
    port = settings_dict["PORT"]
    connections["replica"].close()
    settings_dict["PORT"] = str(silent.getsockname()[1])
    try:
        reading.forget()
        started = time.monotonic()
        page = overview(admin_client)
        took = time.monotonic() - started
        assert 'data-reads="down"' in page and "timeout" in page.lower()
        assert reading.PROBE_TIMEOUT <= took < reading.PROBE_TIMEOUT + 3
        # The verdict is kept: the next pages do not wait again.
        started = time.monotonic()
        overview(admin_client)
        assert jobs.count() == 0
        assert time.monotonic() - started < 1
    finally:
        settings_dict["PORT"] = port
        silent.close()


def test_a_read_database_that_is_not_a_standby_serves_nothing(replica, admin_client, settings):
    """A promoted old replica, or a server of its own, answers but replays nothing:
    its data may have left the primary's behind, so reads go to the primary."""
    settings.DISPATCH = {**settings.DISPATCH, "READ_DATABASE": "not_a_standby"}
    reading.forget()
    tasks.add.enqueue(1, 1)
    verdict = reading.health()
    assert (verdict.state, verdict.used, verdict.fallback) == ("not a standby", "default", True)
    assert "pg_is_in_recovery() is false" in verdict.detail
    assert jobs.count() == 1
    page = overview(admin_client)
    assert 'data-reads="not a standby"' in page and "reads from the primary" in page


def test_a_read_inside_a_transaction_on_the_primary_sees_its_own_writes(replica):
    """``ATOMIC_REQUESTS``, or a view that enqueues then lists: the replica cannot see
    what the open transaction wrote, so reads in it go to the primary."""
    replica.caught_up()
    replica.pause()
    with transaction.atomic():
        job = tasks.add.enqueue(1, 2)
        assert reading.read_alias() == "default"
        assert ids(jobs.list()) == {int(job.id)}
    assert reading.read_alias() == "replica"
    assert jobs.count() == 0  # the paused replica, outside the transaction
