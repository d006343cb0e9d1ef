"""The rules and the dashboard against a real Prometheus scraping real workers.

Each test starts ``rundispatch --metrics-port`` workers (one process, and
``--processes 2``), the web process serving ``django_dispatch.views.metrics``
where it needs one, and a Prometheus that scrapes them every second and
evaluates contrib/prometheus/alerts.yml (``for:`` shortened to seconds).
Everything is checked through Prometheus's HTTP API, as Grafana and
Alertmanager see it: a renamed metric or label fails here.
"""

from __future__ import annotations

import json
import math
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.prometheus.conftest import ALIAS, DASHBOARD, free_port, wait_for
from tests.testapp import observability_tasks, tasks

pytest.importorskip("prometheus_client")

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: How the tier fills in the dashboard's variables (Grafana's, and ours).
VARIABLES = {
    "$__rate_interval": "15s",
    "$__range": "10m",
    "$alias": ALIAS,
    "$namespace": ".*",
    "$queue": ".*",
}


def panel_queries(variables: dict[str, str] = VARIABLES) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel, variables filled in."""
    queries = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", ()):
            expr = target["expr"]
            for name, value in variables.items():
                expr = expr.replace(name, value)
            queries.append((panel["title"], expr))
    return queries


def has_data(prom, expr: str, since: float) -> bool:
    """Some series of ``expr`` had a number (not NaN) since ``since`` (Unix time)."""
    result = prom.api(
        "query_range", query=expr, start=f"{since:.3f}", end=f"{time.time():.3f}", step="1"
    )["result"]
    return any(not math.isnan(float(v)) for series in result for _, v in series["values"])


def value(prom, expr: str) -> float | None:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else None


def enqueue_load(rounds: int) -> None:
    """Successes, failures for good, retries, a job enqueuing a job, jobs that hold a
    slot a while: every outcome and histogram the dashboard draws."""
    for n in range(rounds):
        for i in range(5):
            tasks.add.enqueue(n, i)
        tasks.fail_always.enqueue(f"boom {n}")
        tasks.fail_twice.enqueue(f"retry-{n}")
        observability_tasks.enqueue_child.enqueue(n)
        tasks.sleep_then_record.enqueue(f"slow-{n}", 0.4)
        tasks.echo.enqueue(n)  # queue "emails"
        time.sleep(0.5)


def test_every_dashboard_query_returns_data_from_workers_under_load(
    start_worker, start_web, start_prometheus
):
    single, multi, web = free_port(), free_port(), free_port()
    started = time.time()
    workers = [
        start_worker("--metrics-port", str(single), "--concurrency", "4"),
        start_worker("--metrics-port", str(multi), "--processes", "2", "--concurrency", "2"),
    ]
    start_web(web)
    prom = start_prometheus(workers=[single, multi], web=web)
    # A deferred job keeps the queue's cluster gauges alive once the load is done.
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(0, 0)
    enqueue_load(rounds=12)

    missing = panel_queries()
    deadline = time.monotonic() + 60
    while missing and time.monotonic() < deadline:
        missing = [(title, q) for title, q in missing if not has_data(prom, q, started)]
        if missing:
            time.sleep(1)
    assert not missing, f"dashboard queries without data: {missing}"

    # The selectors select: another alias's targets have nothing.
    other = panel_queries({**VARIABLES, "$alias": "no-such-alias"})
    assert not any(prom.query(q) for _, q in other)

    # One worker of one process and one of two: three processes, 4 + 2x2 slots.
    for expr, expected in [
        ("max without (instance, job) (dispatch_workers)", 3),
        ("max without (instance, job) (dispatch_slots)", 8),
        ("sum(dispatch_worker_slots)", 8),
    ]:
        wait_for(lambda e=expr, n=expected: value(prom, e) == n, f"{expr} == {expected}")
    fail_always = "tests.testapp.tasks.fail_always"
    dead = wait_for(lambda: prom.alerts("DispatchDeadLetters"), "the dead-letter alert")
    assert [(a["task"], a["queue"], a["dispatch_alias"]) for a in dead] == [
        (fail_always, "default", ALIAS)
    ]
    # fail_always raises every time, fail_twice two attempts in three; add never.
    # The rule's rate() needs a counter that grows between two scrapes: a
    # process whose failures of a task all came before that series' first
    # scrape adds nothing to it, so the failures go on while the test waits.
    more = iter(range(10_000))

    def failing_alerts() -> list:
        n = next(more)
        tasks.fail_always.enqueue(f"boom more {n}")
        tasks.fail_twice.enqueue(f"retry-more-{n}")
        alerts = prom.alerts("DispatchFailureRateHigh")
        return alerts if len(alerts) == 2 else []

    failing = wait_for(failing_alerts, "the failure-rate alert for both failing tasks")
    assert sorted(a["task"].rsplit(".", 1)[1] for a in failing) == ["fail_always", "fail_twice"]
    for name in ("DispatchQueueNoLiveWorker", "DispatchNoLeader", "DispatchQueueOldestJobTooOld"):
        assert prom.alerts(name) == [] and prom.alerts(name, "pending") == [], name
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()


def test_queue_with_work_and_no_live_worker_fires_once_the_workers_stop(
    start_worker, start_web, start_prometheus
):
    port, web = free_port(), free_port()
    worker = start_worker("--metrics-port", str(port), "--queues", "default")
    start_web(web)
    prom = start_prometheus(workers=[port], web=web)
    workers = "max without (instance, job) (dispatch_workers)"
    wait_for(lambda: value(prom, workers) == 1, "the worker in Prometheus")
    for n in range(3):
        tasks.add.using(queue_name="reports").enqueue(n, n)  # no worker serves "reports"
    due = 'max without (instance, job) (dispatch_queue_due_jobs{queue="reports"})'
    wait_for(lambda: value(prom, due) == 3, "the backlog in Prometheus")
    time.sleep(4)  # twice the rule's `for:` in the tier: a live worker keeps it quiet
    assert prom.alerts("DispatchQueueNoLiveWorker", "pending") == []
    assert prom.alerts("DispatchQueueNoLiveWorker") == []

    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    firing = wait_for(
        lambda: prom.alerts("DispatchQueueNoLiveWorker"), "the no-live-worker alert to fire"
    )
    assert [(a["queue"], a["severity"], a["dispatch_alias"]) for a in firing] == [
        ("reports", "critical", ALIAS)
    ]
    # Only the web view still reports the backlog: the worker's target is down.
    assert {health for health in prom.targets_up().values()} == {"up", "down"}


def test_oldest_job_too_old_fires_on_a_deferred_backlog(start_worker, start_prometheus):
    port = free_port()
    worker = start_worker(
        "--metrics-port", str(port), "--processes", "2", "--concurrency", "2", "--queues", "default"
    )
    prom = start_prometheus(workers=[port], web=None)
    an_hour_ago = timezone.now() - timedelta(hours=1)
    for n in range(3):  # due since an hour, on a queue no worker serves
        tasks.add.using(queue_name="reports", run_after=an_hour_ago).enqueue(n, n)
    # Deferred to later: scheduled, not due, so not waiting.
    tasks.add.using(queue_name="later", run_after=timezone.now() + timedelta(hours=1)).enqueue(0, 0)
    for n in range(5):  # a served queue whose jobs start at once
        tasks.add.enqueue(n, n)

    firing = wait_for(
        lambda: prom.alerts("DispatchQueueOldestJobTooOld"), "the oldest-job alert to fire"
    )
    assert [(a["queue"], a["severity"]) for a in firing] == [("reports", "warning")]
    age = value(
        prom, 'max without (instance, job) (dispatch_queue_oldest_waiting_seconds{queue="reports"})'
    )
    assert age is not None and 3600 <= age < 3600 + 120
    assert (
        value(
            prom,
            'max without (instance, job) (dispatch_queue_oldest_waiting_seconds{queue="later"})',
        )
        == 0
    )
    assert prom.alerts("DispatchNoLeader") == []
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
