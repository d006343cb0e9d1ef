"""Pausing and resuming queues (issue #17, item 1): the API, the command, the
claim's filter and its cache, and real worker processes honouring a pause."""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_dispatch import pause_queue, paused_queues, resume_queue, store
from django_dispatch.core.states import JobState
from django_dispatch.flow import queue_overview
from django_dispatch.models import Job, PausedQueue
from django_dispatch.runtime import flow_cache
from django_dispatch.testing import drain
from tests.concurrency import run_concurrently
from tests.conftest import ON_POSTGRES, wait_until
from tests.store.helpers import claim_as_worker
from tests.testapp import flow_tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_flow_cache():
    """Each test starts from the database, not from the cache an earlier test left."""
    from django_dispatch.runtime import flow_cache

    flow_cache.forget_paused()


def claim(queues=(), limit=10, poll_interval=1.0):
    return claim_as_worker(limit=limit, queues=queues, poll_interval=poll_interval)


def enqueue(queue, n, seconds=0.0, prefix=None):
    return [
        flow_tasks.mark.using(queue_name=queue).enqueue(f"{prefix or queue}-{i}", seconds)
        for i in range(n)
    ]


# --- the API ---------------------------------------------------------------------


def test_pause_and_resume_say_whether_this_call_changed_it():
    assert paused_queues() == set()
    assert pause_queue("emails") is True
    assert pause_queue("emails") is False  # already paused: no change
    assert paused_queues() == {"emails"}
    assert PausedQueue.objects.count() == 1
    assert resume_queue("emails") is True
    assert resume_queue("emails") is False
    assert paused_queues() == set()


def test_concurrent_pauses_one_wins():
    results = run_concurrently(*[lambda: pause_queue("q")] * 6, together=True)
    assert sorted(results) == [False] * 5 + [True]
    assert PausedQueue.objects.filter(queue_name="q").count() == 1


@pytest.mark.parametrize("bad", ["", "x" * 101, None, 3])
def test_bad_queue_names_are_refused_and_nothing_is_written(bad):
    with pytest.raises(ValueError, match="queue name"):
        pause_queue(bad)
    assert not PausedQueue.objects.exists()


def test_a_backend_with_listed_queues_refuses_other_names(settings):
    settings.TASKS = {
        "default": {
            "BACKEND": "django_dispatch.backend.DispatchBackend",
            "QUEUES": ["default", "emails"],
        }
    }
    with pytest.raises(ValueError, match="not one of"):
        pause_queue("emials")
    assert not PausedQueue.objects.exists()
    assert pause_queue("emails")


def test_a_queue_dropped_from_the_listed_queues_can_still_be_resumed(settings):
    """Review finding (wave 5): resume checked the name against TASKS' QUEUES, so
    once a deploy dropped a paused queue from that list its pause row could
    not be removed and its jobs never started."""
    backend = {"BACKEND": "django_dispatch.backend.DispatchBackend"}
    settings.TASKS = {"default": {**backend, "QUEUES": ["default", "reports"]}}
    assert pause_queue("reports")
    settings.TASKS = {"default": {**backend, "QUEUES": ["default"]}}  # the deploy
    with pytest.raises(ValueError, match="pause one of those"):
        pause_queue("reprots")  # pausing still refuses names it does not list
    assert "Queue 'reports' resumed." in run_command("resume", "reports")
    assert paused_queues() == set()
    assert resume_queue("reports") is False  # not paused (any more): nothing to do
    for bad in ("", "x" * 101, None):
        with pytest.raises(ValueError, match="queue name must be"):
            resume_queue(bad)


def test_pause_is_per_namespace(settings):
    settings.TASKS = {
        "default": {"BACKEND": "django_dispatch.backend.DispatchBackend"},
        "acme": {
            "BACKEND": "django_dispatch.backend.DispatchBackend",
            "OPTIONS": {"NAMESPACE": "acme"},
        },
    }
    assert pause_queue("default", backend="acme")
    assert paused_queues(backend="acme") == {"default"}
    assert paused_queues() == set()
    with pytest.raises(ValueError, match="DispatchBackend"):
        pause_queue("default", backend="nope")


def test_a_pause_in_a_rolled_back_transaction_never_happened():
    with transaction.atomic():
        assert pause_queue("q")
        transaction.set_rollback(True)
    assert paused_queues() == set()


# --- the claim -------------------------------------------------------------------


def test_the_claim_leaves_paused_queues_out_and_enqueue_keeps_working():
    pause_queue("slow")
    slow = enqueue("slow", 3)  # enqueue works while paused
    fast = enqueue("default", 2)
    assert {c.id for c in claim()} == {int(r.id) for r in fast}
    assert claim() == []
    assert claim(queues=["slow"]) == []  # a worker serving only paused queues claims nothing
    assert not store.jobs_due_exist(queues=())  # so --burst ends
    assert not store.jobs_due_exist(queues=["slow"])
    assert Job.objects.filter(queue_name="slow", state=JobState.PENDING).count() == 3
    resume_queue("slow")
    assert store.jobs_due_exist(queues=["slow"])
    assert {c.id for c in claim(queues=["slow", "default"])} == {int(r.id) for r in slow}


def test_a_worker_serving_named_queues_keeps_its_unpaused_ones():
    pause_queue("a")
    enqueue("a", 2)
    b = enqueue("b", 2)
    assert {c.id for c in claim(queues=["a", "b"])} == {int(r.id) for r in b}


def test_drain_skips_paused_queues_and_running_jobs_are_not_touched():
    running = enqueue("slow", 1)
    [claimed] = claim()
    pause_queue("slow")
    enqueue("slow", 2)
    enqueue("default", 2)
    assert drain() == 2
    assert Job.objects.get(pk=claimed.id).state == JobState.RUNNING  # a pause stops starts only
    assert Job.objects.filter(queue_name="slow", state=JobState.PENDING).count() == 2
    assert running
    resume_queue("slow")
    assert drain() == 2


def test_a_fresh_cache_costs_the_claim_no_query():
    """Nothing paused and the cache fresh: the claim is the plain claim."""
    enqueue("default", 1)
    claim()  # fills the cache
    table = PausedQueue._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        claim()
    assert not [q for q in queries if table in q["sql"]]
    filters = ('queue_name" IN', "queue_name = ANY")
    assert not [q for q in queries if any(f in q["sql"] for f in filters)]  # no filter added


def test_a_pause_made_elsewhere_is_seen_within_the_poll_interval():
    """A pause written by another process (here: another connection, bypassing
    this process's invalidation) is seen once the cached set is older than
    the poll interval."""
    enqueue("default", 1)
    claim(limit=1, poll_interval=60)  # cache: nothing paused
    enqueue("default", 2)
    ns = ""

    def pause_elsewhere():
        PausedQueue.objects.create(namespace=ns, queue_name="default")

    run_concurrently(pause_elsewhere)
    # Within the poll interval the stale set may be used; past it, never.
    time.sleep(0.3)
    assert claim(poll_interval=0.2) == []


def test_an_invalidation_during_a_refresh_is_not_lost():
    flow_cache.forget_paused()
    before = time.monotonic()
    flow_cache.flow_for_claim("default", "", 60)
    entry = flow_cache._cache[("default", "")]
    assert entry[0] >= before
    flow_cache.forget_paused()
    assert ("default", "") not in flow_cache._cache


# --- commands --------------------------------------------------------------------


def run_command(*args):
    out = StringIO()
    call_command("dispatch_queue", *args, stdout=out)
    return out.getvalue()


def test_dispatch_queue_command():
    enqueue("emails", 2)
    assert "paused" in run_command("pause", "emails")
    assert "already paused" in run_command("pause", "emails")
    listing = run_command("list")
    assert "emails: PAUSED since" in listing and "pending=2" in listing
    assert run_command("list", "other") == "(no queues with live jobs, paused or configured)\n"
    assert "resumed" in run_command("resume", "emails")
    assert "not paused" in run_command("resume", "emails")
    assert "emails: active pending=2" in run_command("list")
    with pytest.raises(CommandError, match="needs a queue name"):
        run_command("pause")
    with pytest.raises(CommandError, match="queue name"):
        run_command("pause", "x" * 101)
    with pytest.raises(CommandError, match=r"no DispatchBackend alias .nope."):
        run_command("list", "--backend", "nope")


def test_dispatch_status_shows_paused_queues():
    enqueue("emails", 1)
    pause_queue("emails")
    pause_queue("idle")  # paused with no jobs: still listed
    out = StringIO()
    call_command("dispatch_status", stdout=out)
    lines = out.getvalue().splitlines()
    assert any(line.strip().startswith("emails: pending=1") and "PAUSED" in line for line in lines)
    assert any(line.strip().startswith("idle:") and "PAUSED" in line for line in lines)


def test_queue_overview():
    enqueue("a", 2)
    pause_queue("b")
    overview = {q.name: q for q in queue_overview()}
    assert overview["a"].pending == 2 and not overview["a"].paused
    assert overview["b"].paused and overview["b"].paused_at is not None


# --- real workers ----------------------------------------------------------------


def starts(queue):
    return list(
        SideEffect.objects.filter(key__startswith=f"{queue}-").values_list("started_at", flat=True)
    )


def test_three_workers_honour_a_pause_restarts_and_resume(start_worker):
    """No job of the paused queue starts once the pause has committed (plus one
    poll interval); the other queue keeps flowing; the pause holds across a
    restart of every worker; resume drains the backlog."""
    poll = 0.1
    overrides = {"POLL_INTERVAL": poll}
    workers = [start_worker("--concurrency", "2", overrides=overrides) for _ in range(3)]
    enqueue("paused", 60, seconds=0.05, prefix="paused")
    wait_until(lambda: len(starts("paused")) >= 6, what="the queue to be flowing")
    pause_queue("paused")
    committed = timezone.now()
    enqueue("paused", 10, seconds=0.05, prefix="paused-late")
    enqueue("other", 30, seconds=0.02)
    wait_until(lambda: len(starts("other")) == 30, what="the other queue to drain", timeout=30)
    time.sleep(0.5)  # several polls: a worker ignoring the pause would start more
    # On PostgreSQL the NOTIFY makes it at once; otherwise one poll. The slack
    # is for a job claimed just before the commit whose thread starts just after.
    bound = committed + timedelta(seconds=poll + 0.3)
    late = [t for t in starts("paused") if t > bound]
    assert late == [], f"{len(late)} jobs of the paused queue started after the pause"
    waiting = Job.objects.filter(queue_name="paused", state=JobState.PENDING).count()
    assert waiting >= 10  # at least the ones enqueued after the pause

    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0
    started_before_restart = len(starts("paused"))
    workers = [start_worker("--concurrency", "2", overrides=overrides) for _ in range(3)]
    enqueue("other", 5, seconds=0.0, prefix="other-after")
    wait_until(lambda: len(starts("other-after")) == 5, what="the new workers to run jobs")
    time.sleep(0.5)
    assert len(starts("paused")) == started_before_restart  # the pause held

    resume_queue("paused")
    wait_until(
        lambda: (
            not Job.objects.filter(queue_name="paused", state__in=["pending", "running"]).exists()
        ),
        what="the resumed queue to drain",
        timeout=30,
    )
    assert len(starts("paused")) == 70
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == 70 + 35


@pytest.mark.skipif(not ON_POSTGRES, reason="NOTIFY is PostgreSQL's")
def test_on_postgres_a_pause_reaches_an_idle_worker_at_once(start_worker):
    """With a poll interval of 5 s, only the NOTIFY can make the pause seen in time."""
    start_worker("--concurrency", "1", overrides={"POLL_INTERVAL": 5.0})
    enqueue("q", 1, prefix="warm")
    wait_until(lambda: len(starts("warm")) == 1, what="the worker to be listening")
    pause_queue("q")
    time.sleep(0.3)  # the notification is delivered and handled
    enqueue("q", 3, prefix="held")  # the insert wakes it at once; it must claim nothing
    time.sleep(1.0)
    assert starts("held") == []
    resume_queue("q")
    wait_until(lambda: len(starts("held")) == 3, timeout=3, what="resume to wake the worker")
    connections.close_all()
