"""Prometheus metrics: a scripted set of jobs, scraped over HTTP from a real worker.

``rundispatch --metrics-port`` is scraped as Prometheus would; every counter
and histogram count is checked against what the script did, with one
process and with ``--processes 2`` (one endpoint, one consistent set). The
Django view is called in-process; the cost when prometheus-client is not
installed is checked in a fresh interpreter where it cannot be imported.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.test import RequestFactory
from django.utils import timezone

from django_dispatch import cancel
from tests.conftest import ROOT, wait_until
from tests.testapp import observability_tasks, tasks
from tests.testapp.models import SideEffect

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return parse(response.read().decode())


def totals(samples, name: str, by: str) -> Counter:
    """Sum of ``name``'s samples per value of label ``by`` (e.g. state)."""
    out: Counter = Counter()
    for (sample, labels), value in samples.items():
        if sample == name:
            out[dict(labels)[by]] += value
    return out


def by_task(samples, name: str, state: str | None = None) -> Counter:
    out: Counter = Counter()
    for (sample, labels), value in samples.items():
        labels = dict(labels)
        if sample == name and (state is None or labels.get("state") == state):
            out[labels["task"].rsplit(".", 1)[-1]] += value
    return out


ADD = "tests.testapp.tasks.add"


def run_script(tmp_path) -> str:
    """Success, failure, retry, a job enqueued by a job, and a cancel while running.

    Returns the id of the deferred job left scheduled (for the depth gauges).
    """
    tasks.add.enqueue(1, 2)
    tasks.add.enqueue(3, 4)
    tasks.fail_always.enqueue("boom")
    tasks.fail_twice.enqueue("metrics")  # two retries, then a success
    observability_tasks.enqueue_child.enqueue("child")  # enqueues tasks.noop in the worker
    flag = tmp_path / "release"
    running = observability_tasks.wait_for_path.enqueue("cancelled", str(flag))
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(5, 6)
    wait_until(lambda: SideEffect.objects.filter(key="cancelled").exists(), timeout=30)
    assert cancel(running.id)
    # The heartbeat (0.3 s) sees the cancel and asks the job to stop; then it returns.
    wait_until(
        lambda: observability_tasks.wait_for_path.get_result(running.id).status == "FAILED",
        timeout=10,
    )
    import time

    time.sleep(1.0)
    flag.touch()
    return later.id


#: What the script must show (task function name -> count), per state.
EXPECTED = {
    "started": {"add": 2, "fail_always": 1, "fail_twice": 3, "enqueue_child": 1, "noop": 1,
                "wait_for_path": 1},
    "succeeded": {"add": 2, "fail_twice": 1, "enqueue_child": 1, "noop": 1},
    "failed": {"fail_always": 1},
    "retried": {"fail_twice": 2},
    "cancelled": {"wait_for_path": 1},
    "enqueued": {"noop": 1},  # enqueued by the worker itself; the test's own enqueues are ours
}  # fmt: skip


def settled(port: int):
    """The scrape once every outcome of the script is counted."""

    def done():
        samples = scrape(port)
        counted = {state: by_task(samples, "dispatch_jobs_total", state) for state in EXPECTED}
        if all(counted[s] == Counter(v) for s, v in EXPECTED.items()):
            return samples
        return None

    return wait_until(done, timeout=30, what="every outcome of the script counted")


def check_script(samples, *, workers: int, slots: int) -> None:
    started = sum(EXPECTED["started"].values())
    assert by_task(samples, "dispatch_job_run_seconds_count") == Counter(EXPECTED["started"])
    assert sum(by_task(samples, "dispatch_job_queue_wait_seconds_count").values()) == started
    # The histograms' sums are times: the cancelled job ran about a second.
    assert by_task(samples, "dispatch_job_run_seconds_sum")["wait_for_path"] >= 1.0
    assert set(totals(samples, "dispatch_jobs_total", "state")) == set(EXPECTED)
    assert samples["dispatch_worker_slots", frozenset()] == slots


def check_cluster(port: int, *, workers: int, slots: int) -> None:
    def cluster():
        samples = scrape(port)
        scheduled = samples.get(
            ("dispatch_queue_jobs", frozenset({("queue", "default"), ("state", "scheduled")}))
        )
        busy = samples.get(("dispatch_busy_slots", frozenset()))
        return samples if scheduled == 1 and busy == 0 else None  # the last heartbeat is in

    samples = wait_until(cluster, timeout=15, what="the leader's cluster gauges")
    assert samples["dispatch_workers", frozenset()] == workers
    assert samples["dispatch_slots", frozenset()] == slots
    assert samples["dispatch_queue_due_jobs", frozenset({("queue", "default")})] == 0
    assert samples["dispatch_queue_oldest_waiting_seconds", frozenset({("queue", "default")})] == 0
    assert (
        "dispatch_queue_jobs",
        frozenset({("queue", "default"), ("state", "running")}),
    ) not in samples


@pytest.mark.slow
def test_one_worker_counts_the_script(start_worker, tmp_path):
    port = free_port()
    worker = start_worker("--metrics-port", str(port), "--concurrency", "4")
    wait_until(lambda: _answers(port), timeout=30, what="the metrics endpoint")
    run_script(tmp_path)
    samples = settled(port)
    check_script(samples, workers=1, slots=4)
    check_cluster(port, workers=1, slots=4)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()


@pytest.mark.slow
def test_two_processes_give_one_consistent_set(start_worker, tmp_path):
    port = free_port()
    before = _multiproc_dirs()
    worker = start_worker("--metrics-port", str(port), "--processes", "2", "--concurrency", "2")
    wait_until(lambda: _answers(port), timeout=30, what="the metrics endpoint")
    run_script(tmp_path)
    samples = settled(port)
    check_script(samples, workers=2, slots=4)
    check_cluster(port, workers=2, slots=4)
    # Four jobs holding a slot each for a while: two slots per child, so both
    # children run some, and the endpoint counts them once, summed.
    for n in range(4):
        tasks.sleep_then_record.enqueue(f"both-{n}", 0.5)
    wait_until(lambda: SideEffect.objects.filter(note="end").count() == 4, timeout=30)
    pids = set(SideEffect.objects.filter(note="end").values_list("worker_pid", flat=True))
    assert len(pids) == 2, pids

    def four() -> bool:
        counted = scrape(port)
        return by_task(counted, "dispatch_jobs_total", "succeeded")["sleep_then_record"] == 4

    wait_until(four, timeout=10)
    samples = scrape(port)
    assert by_task(samples, "dispatch_jobs_total", "started")["sleep_then_record"] == 4
    assert by_task(samples, "dispatch_job_run_seconds_count")["sleep_then_record"] == 4
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "pid=" not in text
    [directory] = _multiproc_dirs() - before  # made by the supervisor for its children
    assert any(name.endswith(".db") for name in os.listdir(directory))
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    assert not os.path.exists(directory)  # and removed when it exits


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def _multiproc_dirs() -> set[str]:
    import glob
    import tempfile

    return set(glob.glob(os.path.join(tempfile.gettempdir(), "dispatch-metrics-*")))


def test_metrics_port_refuses_a_busy_port(start_worker):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        worker = start_worker("--metrics-port", str(busy.getsockname()[1]))
        assert worker.wait() == 1
    assert "--metrics-port" in worker.output() and "Choose a free port" in worker.output()


def test_the_view_serves_cluster_gauges_and_this_process_enqueues():
    from django_dispatch.observability import exposition
    from django_dispatch.views import metrics as view

    def enqueued(samples) -> float:
        key = (
            "dispatch_jobs_total",
            frozenset({("state", "enqueued"), ("task", ADD), ("queue", "default")}),
        )
        return samples.get(key, 0.0)

    exposition.forget_view_cache()
    before = enqueued(parse(view(RequestFactory().get("/metrics")).content.decode()))
    tasks.add.enqueue(1, 1)
    tasks.add.enqueue(2, 2)
    tasks.echo.enqueue("x")
    exposition.forget_view_cache()
    response = view(RequestFactory().get("/metrics"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = parse(response.content.decode())
    assert enqueued(samples) == before + 2
    assert (
        samples["dispatch_queue_jobs", frozenset({("queue", "default"), ("state", "pending")})] == 2
    )
    assert (
        samples["dispatch_queue_jobs", frozenset({("queue", "emails"), ("state", "pending")})] == 1
    )
    assert samples["dispatch_queue_due_jobs", frozenset({("queue", "default")})] == 2
    assert samples["dispatch_queue_oldest_waiting_seconds", frozenset({("queue", "emails")})] >= 0
    assert samples["dispatch_workers", frozenset()] == 0
    # Only dispatch_* metrics: not the web process's own.
    assert all(name.startswith("dispatch_") for name, _ in samples)
    # Cached: a new job shows up only after VIEW_CACHE_SECONDS.
    tasks.add.enqueue(3, 3)
    again = parse(view(RequestFactory().get("/metrics")).content.decode())
    assert (
        again["dispatch_queue_jobs", frozenset({("queue", "default"), ("state", "pending")})] == 2
    )
    assert view(RequestFactory().post("/metrics")).status_code == 405


def test_enqueue_many_counts_every_job_it_inserts():
    from django_dispatch import enqueue_many
    from django_dispatch.observability import exposition
    from django_dispatch.views import metrics as view

    key = (
        "dispatch_jobs_total",
        frozenset({("state", "enqueued"), ("task", ADD), ("queue", "default")}),
    )
    before = parse(view(RequestFactory().get("/metrics")).content.decode()).get(key, 0.0)
    enqueue_many(tasks.add, [((i, i), {}) for i in range(5)])
    exposition.forget_view_cache()
    after = parse(view(RequestFactory().get("/metrics")).content.decode()).get(key, 0.0)
    assert after == before + 5


BLOCKED = """
import sys
sys.modules["prometheus_client"] = None
sys.modules["opentelemetry"] = None
import django
django.setup()
from django.test import RequestFactory
from django_dispatch.testing import drain
from django_dispatch.views import metrics
from tests.testapp import tasks
result = tasks.add.enqueue(20, 22)
drain()
print(json.dumps({
    "value": tasks.add.get_result(result.id).return_value,
    "view": metrics(RequestFactory().get("/metrics")).status_code,
    "imported": sorted(
        m for m in sys.modules
        if m.startswith(("prometheus_client", "opentelemetry")) and sys.modules[m] is not None
    ),
}))
"""


@pytest.mark.slow  # runs another interpreter
def test_without_the_optional_packages_nothing_is_imported_and_jobs_run():
    connection.ensure_connection()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DISPATCH_DB_NAME": str(connection.settings_dict["NAME"]),
    }
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + BLOCKED],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"value": 42, "view": 501, "imported": []}
