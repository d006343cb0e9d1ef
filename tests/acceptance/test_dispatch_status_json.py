"""``dispatch_status --json``: the documented schema, filled from a real worker's cluster."""

from __future__ import annotations

import json
import signal
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_dispatch import pause_queue
from django_dispatch.models import DeadLetter, Worker
from tests.conftest import wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: Every key of the document and of its lists' items (docs/operating.md).
TOP = {
    "schema", "backend", "namespace", "now", "leader", "workers", "queues", "unplaceable",
    "dead_letters_unreplayed", "cron",
}  # fmt: skip
WORKER = {
    "id", "hostname", "pid", "queues", "concurrency", "running_jobs", "last_seen_at",
    "seen_seconds_ago", "capacity", "locality",
}  # fmt: skip
QUEUE = {"name", "pending", "blocked", "running", "scheduled", "oldest_waiting_seconds", "paused"}
CRON = {"name", "schedule", "timezone", "enabled", "last_run_at", "next_run_at"}


def status_json(*args: str) -> dict:
    out = StringIO()
    call_command("dispatch_status", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def test_an_empty_cluster_is_a_document_with_empty_lists():
    document = status_json()
    assert set(document) == TOP
    assert document["schema"] == 1
    assert (document["backend"], document["namespace"]) == ("default", "")
    assert document["leader"] is None
    assert document["workers"] == document["queues"] == document["cron"] == []
    assert document["unplaceable"] == [] and document["dead_letters_unreplayed"] == 0
    assert datetime.fromisoformat(document["now"]).utcoffset() == timedelta(0)


def test_an_unknown_backend_is_an_error_and_prints_nothing():
    out = StringIO()
    with pytest.raises(CommandError, match="--backend 'nope'"):
        call_command("dispatch_status", "--json", "--backend", "nope", stdout=out)
    assert out.getvalue() == ""


def test_the_document_reports_a_live_worker_its_queues_dead_letters_and_cron(start_worker):
    cron = {"hourly": {"schedule": "0 * * * *", "task": "tests.testapp.tasks.noop"}}
    worker = start_worker(
        "--queues", "default", "--concurrency", "3", "--locality", "eu-west",
        overrides={"CRON": cron},
    )  # fmt: skip
    failing = tasks.fail_always.enqueue("for the dead letters")
    wait_until(lambda: DeadLetter.objects.filter(job_id=failing.id).exists(), what="dead letter")
    an_hour_ago = timezone.now() - timedelta(hours=1)
    tasks.add.using(queue_name="reports", run_after=an_hour_ago).enqueue(1, 1)  # not served
    tasks.add.using(queue_name="later", run_after=timezone.now() + timedelta(hours=1)).enqueue(2, 2)
    pause_queue("reports")
    wait_until(lambda: Worker.objects.filter(pid=worker.pid).exists(), what="worker row")

    document = wait_until(
        lambda: (d := status_json())["leader"] is not None and d["cron"] and d, what="leader"
    )
    assert set(document) == TOP
    row = Worker.objects.get(pid=worker.pid)
    assert document["leader"] == {"worker_id": row.id, "lease_valid": True}
    [seen] = document["workers"]
    assert set(seen) == WORKER
    assert seen["id"] == row.id and seen["pid"] == worker.pid
    assert seen["queues"] == ["default"] and seen["concurrency"] == 3
    assert seen["locality"] == "eu-west" and seen["capacity"] is None
    assert 0 <= seen["seen_seconds_ago"] < 5
    queues = {q["name"]: q for q in document["queues"]}
    assert all(set(q) == QUEUE for q in queues.values())
    assert set(queues) == {"reports", "later"}  # the failed job is no live job
    reports, later = queues["reports"], queues["later"]
    assert (reports["pending"], reports["blocked"], reports["running"]) == (1, 0, 0)
    assert reports["paused"] is True and 3600 <= reports["oldest_waiting_seconds"] < 3660
    # Deferred to later: scheduled, not waiting for a worker.
    assert (later["pending"], later["scheduled"]) == (0, 1)
    assert later["oldest_waiting_seconds"] is None
    assert later["paused"] is False
    assert document["dead_letters_unreplayed"] == 1
    [entry] = document["cron"]
    assert set(entry) == CRON
    assert (entry["name"], entry["schedule"], entry["timezone"], entry["enabled"]) == (
        "hourly", "0 * * * *", "UTC", True,
    )  # fmt: skip
    assert datetime.fromisoformat(entry["next_run_at"]) > datetime.fromisoformat(document["now"])

    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
