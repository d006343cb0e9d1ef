"""The ``prometheus`` tier: a real Prometheus scraping real workers and the metrics view.

Tests marked ``prometheus`` run only with ``DISPATCH_TEST_DB=prometheus``
(``make test-prometheus``, on PostgreSQL from ``scripts/with-postgres``), as
the ``chaos`` tier runs only with its own value: they start a Prometheus
server, several worker processes and a web server, and take about a minute.
Every other run leaves them out; the other tests here (the rule and
dashboard files' static checks) run everywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.db import connection

from tests.conftest import ROOT, TEST_DB, wait_until

CONTRIB = ROOT / "contrib"
ALERTS = CONTRIB / "prometheus" / "alerts.yml"
DASHBOARD = CONTRIB / "grafana" / "django_dispatch.json"
#: The `for:` every rule gets in the tier: the shipped minutes would make it last an hour.
TIER_FOR = "2s"
#: The TASKS alias label the tier's scrape config puts on every target.
ALIAS = "default"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "prometheus: a real Prometheus scraping real workers (DISPATCH_TEST_DB=prometheus, "
        "make test-prometheus; left out of every other run)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tier to its own run, and out of every other."""
    keep, drop = [], []
    for item in items:
        marked = item.get_closest_marker("prometheus") is not None
        (keep if marked == (TEST_DB == "prometheus") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tier_rules(path: Path, for_: str = TIER_FOR) -> Path:
    """alerts.yml with every rule's ``for:`` set to ``for_``, written to ``path``."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = for_
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


class Prometheus:
    """A Prometheus server of the test's own, and its HTTP API."""

    def __init__(self, popen: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.popen = popen
        self.url = f"http://127.0.0.1:{port}"
        self.log = log

    def api(self, endpoint: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{endpoint}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def alerts(self, name: str, state: str = "firing") -> list[dict[str, str]]:
        """The label sets of alert ``name`` in ``state`` (firing, pending)."""
        return [
            alert["labels"]
            for alert in self.api("alerts")["alerts"]
            if alert["labels"]["alertname"] == name and alert["state"] == state
        ]

    def targets_up(self) -> dict[str, str]:
        return {t["scrapeUrl"]: t["health"] for t in self.api("targets")["activeTargets"]}

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


@pytest.fixture
def start_prometheus(tmp_path) -> Iterator[Any]:
    """``start_prometheus(workers=[port, ...], web=port)``: a Prometheus scraping those
    ``rundispatch --metrics-port`` endpoints and the web process's metrics view every
    second, with alerts.yml's rules (``for:`` shortened) evaluated every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run scripts/ensure-prometheus (make does)")
    started: list[Prometheus] = []

    def start(*, workers: list[int], web: int | None) -> Prometheus:
        labels = {"dispatch_alias": ALIAS}
        scrape = [
            {
                "job_name": "dispatch-workers",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{p}" for p in workers], "labels": labels}
                ],
            }
        ]
        if web is not None:
            scrape.append(
                {
                    "job_name": "dispatch-web",
                    "metrics_path": "/dispatch/metrics",
                    "static_configs": [{"targets": [f"127.0.0.1:{web}"], "labels": labels}],
                }
            )
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(tier_rules(tmp_path / "alerts.yml"))],
            "scrape_configs": scrape,
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        log = tmp_path / "prometheus.log"
        popen = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        server = Prometheus(popen, port, log)
        started.append(server)

        def ready() -> bool:
            if popen.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{server.output()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{server.url}/-/ready", timeout=1) as r,
            ):
                return r.status == 200
            return False

        wait_until(ready, timeout=30, what="prometheus ready")
        return server

    yield start
    for server in started:
        server.popen.terminate()
        try:
            server.popen.wait(10)
        except subprocess.TimeoutExpired:
            server.popen.kill()
            server.popen.wait()


@pytest.fixture
def start_web(transactional_db, tmp_path) -> Iterator[Any]:
    """``start_web(port)``: ``manage.py runserver`` with the metrics view, on the test database."""
    started: list[subprocess.Popen[bytes]] = []

    def start(port: int) -> subprocess.Popen[bytes]:
        connection.ensure_connection()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.prometheus.settings",
            "DISPATCH_DB_NAME": str(connection.settings_dict["NAME"]),
            "PYTHONUNBUFFERED": "1",
        }
        log = tmp_path / "web.log"
        popen = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(popen)

        def answers() -> bool:
            if popen.poll() is not None:
                raise AssertionError(f"the web process exited:\n{log.read_text()}")
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{port}/dispatch/metrics"
                with urllib.request.urlopen(url, timeout=2) as r:
                    return r.status == 200
            return False

        wait_until(answers, timeout=30, what="the metrics view answering")
        return popen

    yield start
    for popen in started:
        popen.terminate()
        try:
            popen.wait(10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def wait_for(condition: Any, what: str, timeout: float = 45.0) -> Any:
    """``wait_until`` at a pace fit for an HTTP API (Prometheus evaluates every second)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)
