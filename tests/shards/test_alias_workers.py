"""Real workers, two real databases: the ``eu`` alias's worker serves ``jobs_eu``,
the default worker serves the default database, and no row of ``eu``'s is ever
written to the default database.

One run touches every table django_dispatch has: jobs (plain, failing into a
dead letter, rate-limited, concurrency-capped, in a paused queue), a cron
entry from ``DISPATCH["CRON"]``, a workflow run that waits for an event, the
event, usage records, an artifact, leadership and worker rows. Then every
model's rows are counted on both databases.
"""

from __future__ import annotations

import signal

import pytest
from django.apps import apps
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_dispatch import events, pause_queue
from django_dispatch.core.states import JobState
from django_dispatch.models import ConcurrencyWait, Job, WorkflowRun
from tests.conftest import wait_until
from tests.testapp import artifact_tasks, flow_tasks, tasks
from tests.testapp.models import SideEffect
from tests.testapp.wait_workflows import awaits

from .conftest import EU_DB, two_databases, worker_env

pytestmark = [
    two_databases,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", EU_DB]),
    pytest.mark.usefixtures("eu_alias"),
]

#: Both workers' and this process's settings: a cron entry of ``eu``'s firing
#: every second, a rate-limited queue (its windows are rows too).
EXTRA = {
    "CRON": {
        "eu-tick": {"schedule": "* * * * * *", "task": "tests.testapp.tasks.noop", "backend": "eu"}
    },
    "QUEUES": {"metered": {"rate_limit": "1000/s"}},
    "SCHEDULER_INTERVAL": 0.2,
}


def _counts(db: str) -> dict[str, int]:
    models = apps.get_app_config("django_dispatch").get_models()
    return {m.__name__: m._default_manager.using(db).count() for m in models}


def _eu_jobs():
    return Job.objects.using(EU_DB)


def test_an_alias_database_holds_every_row_of_the_alias_and_only_its_worker_serves_it(
    start_worker,
):
    with override_settings(DISPATCH={**settings.DISPATCH, **EXTRA}):
        _run_everything_on_eu(start_worker)


def _run_everything_on_eu(start_worker) -> None:
    env = worker_env()
    default = start_worker("--worker-id", "w-default", overrides=EXTRA, env=env)
    # Two forked processes of two job threads each: the served database is the
    # process's, which threads and forked children share (ContextVars are not).
    eu = start_worker(
        "--backend",
        "eu",
        "--worker-id",
        "w-eu",
        "--processes",
        "2",
        "--concurrency",
        "2",
        overrides=EXTRA,
        env=env,
    )
    eu_task = {"backend": "eu"}
    pause_queue("held", backend="eu")
    held = tasks.record.using(queue_name="held", **eu_task).enqueue("held")
    tasks.record.using(**eu_task).enqueue("eu-1")
    tasks.fail_always.using(**eu_task).enqueue("into a dead letter")
    tasks.record.using(queue_name="metered", **eu_task).enqueue("eu-metered")
    artifact_tasks.save_report.using(**eu_task).enqueue("eu-report")
    for i in range(4):  # a cap of 3: the fourth waits, listed in ConcurrencyWait
        flow_tasks.capped.using(concurrency_key="k", **eu_task).enqueue(f"c{i}", 1.5)
    wait_until(
        lambda: ConcurrencyWait.objects.using(EU_DB).exists(), what="a group waits at its cap"
    )
    run = awaits.start({"key": "eu-wait", "event_key": "k1"}, backend="eu")
    wait_until(
        lambda: SideEffect.objects.filter(key="eu-wait", note="started").exists(),
        what="the workflow step to wait for its event",
    )
    events.publish("payment", {"amount": 5}, key="k1", backend="eu")
    wait_until(
        lambda: WorkflowRun.objects.using(EU_DB).get(pk=run.pk).state == "succeeded",
        what="the eu workflow run to succeed",
    )
    wait_until(
        lambda: (
            _eu_jobs()
            .filter(idempotency_key__startswith="cron:eu-tick:", state="succeeded")
            .count()
            >= 2
        ),
        what="two slots of eu's cron entry to run",
    )
    wait_until(
        lambda: (
            not _eu_jobs()
            .exclude(pk=held.id)
            .filter(state__in=["pending", "running", "blocked"])
            .exists()
            and _eu_jobs().filter(task_path__endswith="save_report", state="succeeded").exists()
        ),
        what="every eu job but the held one to finish",
    )
    on_eu, on_default = _counts(EU_DB), _counts("default")
    # Every table has eu's rows (the wait row came and went, seen above) ...
    assert {name for name, n in on_eu.items() if not n} <= {"ConcurrencyWait"}, on_eu
    # ... and the default database has none: only the default worker's own rows.
    assert on_default == {**dict.fromkeys(on_default, 0), "Worker": 1, "Leadership": 1}, on_default
    assert on_eu["Worker"] == 2  # the two children registered on jobs_eu
    assert Job.objects.using("default").count() == 0
    # The liveness probe of each alias finds its workers in its database.
    call_command("dispatch_health", "--backend", "eu", "--min-workers", "2", verbosity=0)
    call_command("dispatch_health", "--min-workers", "1", verbosity=0)
    with pytest.raises(CommandError, match="unhealthy"):
        call_command("dispatch_health", "--min-workers", "2", verbosity=0)  # not eu's
    for worker in (eu, default):
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
    # The default worker, up all along, never ran one of eu's jobs.
    ran_by = {w for ids in _eu_jobs().values_list("worker_ids", flat=True) for w in ids}
    assert ran_by and ran_by <= {"w-eu.0", "w-eu.1"}, ran_by  # only eu's forked children
    assert _eu_jobs().get(pk=held.id).state == JobState.PENDING  # its queue is paused
    assert not _eu_jobs().exclude(namespace="eu").exists()
    assert "w-eu" not in default.output()
