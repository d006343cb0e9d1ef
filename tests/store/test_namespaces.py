"""Namespaces (issue 14): aliases ``a`` and ``b`` on one database never see each other.

In-process tests call the store and the services with real rows (PostgreSQL
and SQLite); the ``slow`` ones start one real worker per namespace. The
default namespace ``""`` is what every other test file runs in.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.core import checks
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_dispatch import enqueue_many, replay, store
from django_dispatch.checks import check_abandoned_namespaces, check_namespaces
from django_dispatch.core.states import JobState
from django_dispatch.models import CronEntry, DeadLetter, Job, Leadership, Worker
from django_dispatch.runtime import scheduler
from django_dispatch.runtime.listener import Listener, listener_params
from django_dispatch.store.sources.fused_pg import claim_sql
from tests.conftest import postgres_only, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_dispatch.backend.DispatchBackend"


def _alias(namespace: str) -> dict:
    return {
        "BACKEND": BACKEND,
        "QUEUES": [],
        "OPTIONS": {"BACKOFF": "tests.testapp.tasks.quick_backoff", "NAMESPACE": namespace},
    }


#: Aliases ``a`` and ``b`` beside the test settings' ``default`` (namespace "").
EXTRA_ALIASES = {"a": _alias("a"), "b": _alias("b")}
TASKS_AB = {"default": _alias(""), **EXTRA_ALIASES}


@pytest.fixture(autouse=True)
def two_namespaces():
    with override_settings(TASKS=TASKS_AB):
        yield


def claim(namespace: str, worker: str = "w", limit: int = 50) -> list[store.ClaimedJob]:
    return store.jobs_claim(
        worker_id=worker, queues=(), limit=limit, lease_seconds=30.0, namespace=namespace
    )


def ns_of(result) -> str:
    return Job.objects.get(pk=result.id).namespace


# --- rows carry their backend's namespace; claims stay inside it --------------------


def test_each_claim_takes_only_its_namespace_jobs():
    in_a = [tasks.add.using(backend="a").enqueue(i, i) for i in range(3)]
    in_b = [tasks.add.using(backend="b").enqueue(i, i) for i in range(2)]
    in_default = tasks.add.enqueue(0, 0)
    assert {ns_of(r) for r in in_a} == {"a"} and {ns_of(r) for r in in_b} == {"b"}
    assert ns_of(in_default) == ""
    assert sorted(c.id for c in claim("b")) == sorted(int(r.id) for r in in_b)
    assert sorted(c.id for c in claim("a")) == sorted(int(r.id) for r in in_a)
    assert [c.id for c in claim("")] == [int(in_default.id)]
    assert claim("a") == claim("b") == claim("") == []
    assert not store.jobs_due_exist(queues=(), namespace="a")


def test_enqueue_many_writes_its_backend_namespace():
    results = enqueue_many(
        tasks.add.using(backend="b"), [((i, i), {}) for i in range(5)], return_results=True
    )
    assert {ns_of(r) for r in results} == {"b"}
    assert claim("a") == []
    assert len(claim("b")) == 5


def test_the_same_idempotency_key_in_two_namespaces_is_two_jobs():
    first_a = tasks.add.using(backend="a", idempotency_key="k").enqueue(1, 1)
    again_a = tasks.add.using(backend="a", idempotency_key="k").enqueue(1, 1)
    first_b = tasks.add.using(backend="b", idempotency_key="k").enqueue(1, 1)
    assert first_a.id == again_a.id  # one live job per key in a namespace
    assert first_b.id != first_a.id
    assert Job.objects.filter(idempotency_key="k").count() == 2
    assert [c.id for c in claim("a")] == [int(first_a.id)]
    assert [c.id for c in claim("b")] == [int(first_b.id)]


def test_the_same_partition_key_in_two_namespaces_runs_independently():
    """Each namespace's head of key ``p`` runs at once; the one behind waits in its own."""
    head_a = tasks.add.using(backend="a", partition_key="p").enqueue(1, 1)
    behind_a = tasks.add.using(backend="a", partition_key="p").enqueue(1, 2)
    head_b = tasks.add.using(backend="b", partition_key="p").enqueue(1, 3)
    behind_b = tasks.add.using(backend="b", partition_key="p").enqueue(1, 4)
    [running_a] = claim("a")
    [running_b] = claim("b")  # a's running head does not block b's key
    assert (running_a.id, running_b.id) == (int(head_a.id), int(head_b.id))
    assert claim("a") == claim("b") == []  # each one's second job waits behind its head
    assert store.job_finish_if_leased(running_a.lease, 2)
    # Finishing a's head frees a's key only.
    assert Job.objects.get(pk=behind_a.id).state == JobState.PENDING
    assert [c.id for c in claim("a")] == [int(behind_a.id)]
    assert claim("b") == []
    assert store.job_finish_if_leased(running_b.lease, 4)
    assert [c.id for c in claim("b")] == [int(behind_b.id)]


def test_rescue_and_purge_stay_in_their_namespace():
    tasks.add.using(backend="a").enqueue(1, 1)
    tasks.add.using(backend="b").enqueue(1, 1)
    claim("a", worker="wa")
    claim("b", worker="wb")
    Job.objects.update(lease_expires_at=Job.objects.first().enqueued_at)  # both expired
    requeued, _ = store.jobs_rescue_expired(max_worker_lost=3, namespace="a")
    assert Job.objects.get(pk__in=requeued).namespace == "a"
    assert Job.objects.get(namespace="b").state == JobState.RUNNING
    [again_a] = claim("a", worker="wa")
    [running_b] = Job.objects.filter(namespace="b")
    assert store.job_finish_if_leased(again_a.lease, 2)
    assert store.job_finish_if_leased(
        store.Lease(running_b.pk, running_b.worker_id, running_b.lease_epoch, namespace="b"), 2
    )
    Job.objects.update(finished_at=timezone.now() - timedelta(days=1))
    deleted = store.jobs_purge({JobState.SUCCEEDED: 60}, batch=100, namespace="b")
    assert deleted == 1
    assert list(Job.objects.values_list("namespace", flat=True)) == ["a"]


def test_each_namespace_elects_its_own_leader():
    assert store.leadership_acquire("wa", ttl=30, namespace="a")
    assert store.leadership_acquire("wb", ttl=30, namespace="b")
    assert not store.leadership_acquire("wb", ttl=30, namespace="a")
    assert store.leadership_holder(namespace="a") == ("wa", True)
    assert store.leadership_holder(namespace="b") == ("wb", True)
    assert store.leadership_holder() is None  # the default namespace: nobody yet
    assert set(Leadership.objects.values_list("namespace", flat=True)) == {"a", "b"}
    store.leadership_release("wa", namespace="a")
    assert store.leadership_holder(namespace="b") == ("wb", True)


def test_a_cron_entry_of_the_same_name_fires_once_per_slot_in_each_namespace():
    for namespace in ("a", "b"):
        CronEntry.objects.create(
            namespace=namespace,
            name="nightly",
            schedule="* * * * *",
            timezone="UTC",
            task_path="tests.testapp.tasks.noop",
        )
    # One slot due in each: the current minute, the watermark just before it.
    slot = store.db_now("default").replace(second=0, microsecond=0)
    CronEntry.objects.update(last_slot=slot - timedelta(minutes=1), next_run_at=slot)
    assert scheduler.tick(namespace="a") == 1
    assert scheduler.tick(namespace="a") == 0  # that slot fired once
    assert list(Job.objects.values_list("namespace", flat=True)) == ["a"]
    assert scheduler.tick(namespace="b") == 1
    assert scheduler.tick(namespace="b") == 0
    keys = dict(Job.objects.values_list("namespace", "idempotency_key"))
    assert keys["a"] == keys["b"]  # the same slot's key, one job in each namespace


def test_run_now_of_a_cron_entry_enqueues_in_the_entry_namespace():
    from django_dispatch.services import run_cron_entry_now

    entry = CronEntry.objects.create(
        namespace="b",
        name="x",
        schedule="0 3 * * *",
        timezone="UTC",
        task_path="tests.testapp.tasks.noop",
    )
    result = run_cron_entry_now(entry.pk)
    assert ns_of(result) == "b"
    assert [c.id for c in claim("b")] == [int(result.id)]


def test_cron_settings_entries_sync_into_their_backend_namespace():
    cron = {
        "in-a": {"schedule": "0 3 * * *", "task": "tests.testapp.tasks.noop", "backend": "a"},
        "in-default": {"schedule": "0 3 * * *", "task": "tests.testapp.tasks.noop"},
    }
    with override_settings(DISPATCH={"CRON": cron}):
        scheduler.sync_from_settings(namespace="a")
        scheduler.sync_from_settings(namespace="b")
        scheduler.sync_from_settings(namespace="")
    assert sorted(CronEntry.objects.values_list("namespace", "name")) == [
        ("", "in-default"),
        ("a", "in-a"),
    ]


def test_a_dead_letter_replay_stays_in_its_namespace():
    for _ in range(2):
        tasks.fail_always.using(backend="b").enqueue("boom")
    for claimed in claim("b"):
        assert store.job_fail_if_leased(claimed.lease, [{"message": "boom"}], retry_in=None)
    first, second = DeadLetter.objects.order_by("id")
    assert (first.namespace, second.namespace) == ("b", "b")
    again = replay(first.pk)
    assert ns_of(again) == "b"
    assert [c.id for c in claim("b")] == [int(again.id)] and claim("a") == []
    # Even when the alias has moved to another namespace since.
    with override_settings(TASKS={**TASKS_AB, "b": _alias("b2")}):
        replayed = replay(second.pk)
    assert ns_of(replayed) == "b"


def test_a_workflow_started_on_a_backend_lives_in_its_namespace():
    from django_dispatch.models import WorkflowRun, WorkflowTask
    from tests.testapp.workflows import three as diamond

    run = diamond.start({"n": 1}, backend="a")
    assert WorkflowRun.objects.get(pk=run.pk).namespace == "a"
    assert set(WorkflowTask.objects.filter(run=run).values_list("namespace", flat=True)) == {"a"}
    assert set(Job.objects.values_list("namespace", flat=True)) == {"a"}
    # Workflow idempotency keys are per namespace too.
    one = diamond.start({"n": 1}, idempotency_key="k", backend="a")
    two = diamond.start({"n": 1}, idempotency_key="k", backend="b")
    assert one.pk != two.pk
    assert diamond.start({"n": 1}, idempotency_key="k", backend="b").pk == two.pk
    with pytest.raises(ValueError, match="no DispatchBackend alias 'nope'"):
        diamond.start({"n": 1}, backend="nope")


def test_workflow_operations_keep_a_run_in_its_namespace():
    from django_dispatch.workflows.services import cancel_run, replay_run
    from tests.testapp.workflows import fan

    run = fan.start({"key": "ops"}, backend="b")
    assert cancel_run(run.pk)
    assert set(Job.objects.values_list("namespace", "state")) == {("b", JobState.CANCELLED)}
    replay_run(run.pk, "split")  # the reopened step's new job: in the run's namespace
    assert set(Job.objects.filter(state=JobState.PENDING).values_list("namespace", flat=True)) == {
        "b"
    }
    assert claim("a") == [] and len(claim("b")) == 1


def test_drain_runs_one_namespace_as_a_worker_would():
    from django_dispatch.testing import drain
    from django_dispatch.workflows.testing import drain_workflows
    from tests.testapp.workflows import fan

    tasks.record.using(backend="a").enqueue("ka")
    tasks.record.using(backend="b").enqueue("kb")
    assert drain(backend="b") == 1
    assert list(Execution.objects.values_list("key", flat=True)) == ["kb"]
    assert drain() == 0  # the default alias's namespace ("") has nothing
    assert drain(backend="a") == 1
    run = fan.start({"key": "drained"}, backend="a")
    assert drain_workflows(backend="b", concurrency=2) == 0
    assert drain_workflows(backend="a", concurrency=2) == 4
    run.refresh_from_db()
    assert run.state == "succeeded"


def test_workers_register_in_their_namespace_and_stale_rows_are_swept_per_namespace():
    store.worker_register("wa", hostname="h", pid=1, queues=[], concurrency=1, namespace="a")
    store.worker_register("wb", hostname="h", pid=2, queues=[], concurrency=1, namespace="b")
    Worker.objects.update(last_seen_at=timezone.now() - timedelta(hours=1))
    assert store.workers_delete_stale(stale_seconds=60, namespace="a") == 1
    assert list(Worker.objects.values_list("namespace", flat=True)) == ["b"]


# --- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "namespace, problem",
    [
        ("x" * 64, "is 64 characters long"),
        ("acme prod", "contains ' '"),
        ("o'hara", 'contains "\'"'),
        (7, "must be a string"),
    ],
)
def test_an_invalid_namespace_is_a_system_check_error(namespace, problem):
    with override_settings(TASKS={"default": _alias(namespace)}):
        [error] = check_namespaces()
    assert error.id == "django_dispatch.E040"
    assert problem in error.msg and "TASKS['default']['OPTIONS']['NAMESPACE']" in error.msg


def test_valid_namespaces_pass_the_check():
    for namespace in ("", "acme", "ws_acme:prod-1.eu", "x" * 63):
        with override_settings(TASKS={"default": _alias(namespace)}):
            assert check_namespaces() == []


def test_live_jobs_left_in_a_namespace_no_alias_uses_are_reported_with_their_count():
    for _ in range(3):
        tasks.add.using(backend="a").enqueue(1, 1)
    tasks.add.using(backend="b").enqueue(1, 1)
    with override_settings(TASKS={"default": _alias(""), "b": _alias("b")}):
        messages = check_abandoned_namespaces(databases=["default"])
    assert [(m.id, m.level) for m in messages] == [("django_dispatch.W041", checks.WARNING)]
    assert messages[0].msg.startswith("3 live jobs are in namespace 'a'")
    assert check_abandoned_namespaces(databases=["default"]) == []  # a is configured again


def test_rundispatch_with_an_unknown_backend_is_a_command_error():
    with pytest.raises(CommandError, match=r"--backend 'nope'.*\['a', 'b', 'default'\]"):
        call_command("rundispatch", "--backend", "nope", "--burst")
    assert not Worker.objects.exists()


def test_a_cron_entry_naming_an_unknown_backend_is_a_check_error():
    from django_dispatch.checks import check_dispatch_settings

    cron = {"x": {"schedule": "0 3 * * *", "task": "tests.testapp.tasks.noop", "backend": "c"}}
    with override_settings(DISPATCH={"CRON": cron}):
        errors = [m for m in check_dispatch_settings() if m.id == "django_dispatch.E036"]
    assert len(errors) == 1 and "'backend' 'c'" in errors[0].msg


# --- PostgreSQL: NOTIFY per namespace, the claim plan -------------------------------


@postgres_only
def test_notify_wakes_only_the_listener_of_the_job_namespace():
    """A real LISTEN connection per namespace; the real insert trigger sends NOTIFY."""
    woken = {ns: threading.Event() for ns in ("a", "b", "")}
    connection.ensure_connection()
    listeners = [
        Listener(listener_params(connection), woken[ns], health_interval=5.0, namespace=ns)
        for ns in woken
    ]
    for listener in listeners:
        listener.start()
    try:
        for listener in listeners:
            assert listener.connected.wait(10)
        time.sleep(0.2)
        for event in woken.values():
            event.clear()  # the wake-up every listener gives itself on connecting
        tasks.add.using(backend="a").enqueue(1, 1)
        assert woken["a"].wait(5)
        time.sleep(0.5)
        assert not woken["b"].is_set() and not woken[""].is_set()
        enqueue_many(tasks.add.using(backend="b"), [((1, 1), {})] * 3)
        assert woken["b"].wait(5)
        time.sleep(0.5)
        assert not woken[""].is_set()
        tasks.add.enqueue(1, 1)  # the default namespace keeps the historical channel
        assert woken[""].wait(5)
        assert store.notify_channel("") == "django_dispatch"
    finally:
        for listener in listeners:
            listener.stop()
        for listener in listeners:
            listener.join(5)


#: Pending rows of namespace ``b`` (issue 14's number: one INSERT … SELECT
#: generate_series takes about 5 s here, so the test uses all of them).
BACKLOG_B = 1_000_000


@postgres_only
def test_a_claim_in_one_namespace_reads_no_row_of_another_namespace_backlog():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_dispatch_job (namespace, task_path, backend, queue_name, "
            "priority, args, kwargs, state, attempts, max_attempts, worker_lost_count, "
            "lease_epoch, errors, worker_ids) "
            "SELECT 'b', 'tests.testapp.tasks.add', 'b', 'default', 0, '[1, 1]', '{}', "
            "'pending', 0, 1, 0, 0, '[]', '[]' FROM generate_series(1, %s)",
            [BACKLOG_B],
        )
    mine = [tasks.add.using(backend="a").enqueue(i, i) for i in range(5)]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_dispatch_job")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
            + claim_sql(queues=False, exclude=False, namespace="a"),
            {"window": 8, "lease": 8, "worker_id": "w", "lease_seconds": 30.0},
        )
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)  # EXPLAIN ANALYZE leased them: undo
    text = json.dumps(plan)
    scans = _nodes(plan[0]["Plan"], lambda n: "Relation Name" in n or "Index Name" in n)
    claim_scans = [n for n in scans if n.get("Index Name") == "dispatch_job_claim"]
    assert claim_scans, text
    for node in claim_scans:
        # "(namespace)::text = 'a'::text", or "namespace = 'a'::text" in an index-only scan
        assert re.search(r"namespace\)?(::text)? = 'a'", node.get("Index Cond", "")), node
        assert node["Actual Rows"] <= len(mine), node  # not one row of b's backlog read
    assert not any(
        n.get("Node Type") == "Seq Scan" and n.get("Relation Name") == "django_dispatch_job"
        for n in scans
    ), text
    for node in claim_scans:  # an ordered index range: a handful of pages, not b's million
        assert node["Shared Hit Blocks"] + node["Shared Read Blocks"] < 50, node
    # And the ORM claim (SQLite's) uses the same index, led by the namespace.
    with transaction.atomic():
        orm_plan = store.claim_candidates("default", [], 8, namespace="a", priority=0).explain()
    assert "dispatch_job_claim" in orm_plan and "Sort" not in orm_plan, orm_plan
    assert sorted(c.id for c in claim("a")) == sorted(int(r.id) for r in mine)


def _nodes(node: dict, keep) -> list[dict]:
    found = [node] if keep(node) else []
    for child in node.get("Plans", []):
        found += _nodes(child, keep)
    return found


# --- real workers, one per namespace -----------------------------------------------

WORKER_ENV = {"DISPATCH_TASKS_OVERRIDES": json.dumps(EXTRA_ALIASES)}


@pytest.mark.slow
def test_two_workers_each_run_only_their_namespace_jobs(start_worker):
    in_a = [tasks.record.using(backend="a").enqueue(f"a{i}") for i in range(6)]
    in_b = [tasks.record.using(backend="b").enqueue(f"b{i}") for i in range(4)]
    keyed = [
        tasks.record.using(backend=ns, partition_key="p", idempotency_key="k").enqueue(f"{ns}-p")
        for ns in ("a", "b")
    ]
    worker_a = start_worker("--backend", "a", "--burst", "--worker-id", "wa", env=WORKER_ENV)
    assert worker_a.wait() == 0, worker_a.output()
    ran = set(Execution.objects.values_list("key", flat=True))
    assert ran == {f"a{i}" for i in range(6)} | {"a-p"}
    assert Job.objects.filter(namespace="b", state=JobState.PENDING).count() == 5
    worker_b = start_worker("--backend", "b", "--burst", "--worker-id", "wb", env=WORKER_ENV)
    assert worker_b.wait() == 0, worker_b.output()
    for result, worker in [*((r, "wa") for r in in_a), *((r, "wb") for r in in_b)]:
        job = Job.objects.get(pk=result.id)
        assert (job.state, job.worker_ids) == (JobState.SUCCEEDED, [worker])
    assert {Job.objects.get(pk=r.id).worker_ids[0] for r in keyed} == {"wa", "wb"}


@pytest.mark.slow
def test_each_namespace_has_its_own_leader_and_killing_one_leaves_the_other(start_worker):
    workers = {
        ns: start_worker("--backend", ns, "--worker-id", f"w{ns}", env=WORKER_ENV)
        for ns in ("a", "b")
    }
    for ns in ("a", "b"):
        wait_until(
            lambda ns=ns: store.leadership_holder(namespace=ns) == (f"w{ns}", True),
            what=f"w{ns} leads namespace {ns}",
        )
    assert store.leadership_holder() is None  # nobody serves the default namespace
    workers["a"].signal(signal.SIGKILL)
    workers["a"].wait()
    time.sleep(3.0)  # > LEASE_SECONDS (2): a's lease has lapsed by now
    assert store.leadership_holder(namespace="a") == ("wa", False)
    assert store.leadership_holder(namespace="b") == ("wb", True)
    # b's worker still runs b's jobs, and does not take a's leadership or jobs.
    job_b = tasks.record.using(backend="b").enqueue("after")
    job_a = tasks.record.using(backend="a").enqueue("orphan")
    wait_until(lambda: Job.objects.get(pk=job_b.id).state == JobState.SUCCEEDED)
    time.sleep(0.5)
    assert Job.objects.get(pk=job_a.id).state == JobState.PENDING
    assert store.leadership_holder(namespace="a") == ("wa", False)


@pytest.mark.slow
@postgres_only
def test_an_idle_worker_is_woken_by_its_namespace_jobs_only(start_worker):
    """POLL_INTERVAL is 30 s: a pickup within seconds is the NOTIFY of its namespace."""
    worker = start_worker(
        "--backend", "b", overrides={"POLL_INTERVAL": 30.0, "LISTEN": True}, env=WORKER_ENV
    )
    wait_until(lambda: Worker.objects.filter(namespace="b").exists(), what="b's worker")
    time.sleep(1.0)  # the listener is connected and the first (empty) claims are done
    started = time.monotonic()
    job = tasks.record.using(backend="b").enqueue("woken")
    wait_until(lambda: Job.objects.get(pk=job.id).state == JobState.SUCCEEDED, timeout=10)
    assert time.monotonic() - started < 5.0, worker.output()
    other = tasks.record.using(backend="a").enqueue("not-mine")
    time.sleep(1.0)
    assert Job.objects.get(pk=other.id).state == JobState.PENDING


# --- operators: commands and admin ----------------------------------------------------


def test_dispatch_status_and_purge_take_a_backend():
    from io import StringIO

    tasks.add.using(backend="a").enqueue(1, 1)
    tasks.echo.using(backend="b").enqueue("x")  # queue "emails"
    out = StringIO()
    call_command("dispatch_status", "--backend", "a", stdout=out)
    assert "Namespace: a" in out.getvalue()
    assert "default: pending=1" in out.getvalue() and "emails" not in out.getvalue()
    for claimed in [*claim("a"), *claim("b")]:
        assert store.job_finish_if_leased(claimed.lease, None)
    Job.objects.update(finished_at=timezone.now() - timedelta(days=30))
    out = StringIO()
    with override_settings(DISPATCH={"JOB_RETENTION": {"succeeded": 60}}):
        call_command("dispatch_purge", "--backend", "b", stdout=out)
    assert out.getvalue().startswith("Deleted 1 finished jobs")
    assert list(Job.objects.values_list("namespace", flat=True)) == ["a"]
    for command in ("dispatch_status", "dispatch_purge"):
        with pytest.raises(CommandError, match=r"--backend 'c'.*DispatchBackend aliases"):
            call_command(command, "--backend", "c")


def test_every_admin_list_shows_and_filters_by_namespace(admin_client):
    from django.urls import reverse

    tasks.add.using(backend="a").enqueue(1, 1)
    tasks.add.using(backend="b").enqueue(2, 2)
    from django.contrib import admin

    from django_dispatch import models

    for model in (Job, DeadLetter, CronEntry, Worker, models.WorkflowRun, models.WorkflowTask):
        model_admin = admin.site._registry[model]
        assert "namespace" in model_admin.list_display, model
        filters = [f[0] if isinstance(f, tuple) else f for f in model_admin.list_filter]
        assert "namespace" in filters, model
        url = reverse(f"admin:django_dispatch_{model._meta.model_name}_changelist")
        assert admin_client.get(url, {"namespace": "a"}).status_code == 200, model
    response = admin_client.get(reverse("admin:django_dispatch_job_changelist"))
    assert "column-namespace" in response.content.decode()
    url = reverse("admin:django_dispatch_job_changelist")
    page = admin_client.get(url, {"namespace": "a"})
    assert [j.namespace for j in page.context["cl"].result_list] == ["a"]


@pytest.mark.slow
def test_same_named_cron_entries_fire_every_slot_once_in_each_namespace(start_worker):
    """Real schedulers, one per namespace, an entry named ``tick`` in both, every second."""
    for namespace in ("a", "b"):
        CronEntry.objects.create(
            namespace=namespace,
            name="tick",
            schedule="* * * * * *",
            timezone="UTC",
            task_path="tests.testapp.tasks.noop",
        )
    overrides = {"SCHEDULER_INTERVAL": 0.2}
    workers = [
        start_worker("--backend", ns, "--worker-id", f"w{ns}", overrides=overrides, env=WORKER_ENV)
        for ns in ("a", "b")
    ]
    wait_until(
        lambda: all(
            Job.objects.filter(namespace=ns, state=JobState.SUCCEEDED).count() >= 3
            for ns in ("a", "b")
        ),
        what="three fired slots run in each namespace",
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
    slots = {
        ns: list(Job.objects.filter(namespace=ns).values_list("idempotency_key", flat=True))
        for ns in ("a", "b")
    }
    for ns, keys in slots.items():
        assert len(keys) == len(set(keys)), keys  # no slot fired twice in a namespace
        assert all(k.startswith("cron:tick:") for k in keys), keys
        for ids in Job.objects.filter(namespace=ns).values_list("worker_ids", flat=True):
            assert ids in ([], [f"w{ns}"]), ids  # run (if yet) by its namespace's worker
    # Both namespaces fired the same slots (the slots of the seconds both ran).
    assert len(set(slots["a"]) & set(slots["b"])) >= 2


@pytest.mark.slow
def test_a_workflow_started_in_a_namespace_is_run_by_that_namespace_worker(start_worker):
    from tests.testapp.workflows import fan

    run = fan.start({"key": "ns"}, backend="a")
    other = start_worker("--backend", "b", "--worker-id", "wb", env=WORKER_ENV)
    time.sleep(1.0)
    assert not Job.objects.filter(state=JobState.SUCCEEDED).exists()  # b's worker left it
    mine = start_worker("--backend", "a", "--worker-id", "wa", "--concurrency", "2", env=WORKER_ENV)
    run.refresh_from_db()
    wait_until(
        lambda: type(run).objects.get(pk=run.pk).state == "succeeded", what="the run succeeds"
    )
    assert type(run).objects.get(pk=run.pk).output == 23
    jobs = Job.objects.all()
    assert {j.namespace for j in jobs} == {"a"} and len(jobs) == 4
    assert {tuple(j.worker_ids) for j in jobs} == {("wa",)}
    for worker in (other, mine):
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
