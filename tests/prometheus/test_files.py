"""The rule and dashboard files, checked without a server (every run, not only the tier):
each metric they name is one the code exports, each rule links to its runbook."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.conftest import ROOT
from tests.prometheus.conftest import ALERTS, DASHBOARD

prometheus_client = pytest.importorskip("prometheus_client")

OPERATING = ROOT / "docs" / "operating.md"
RUNBOOK = "https://django-dispatch.readthedocs.io/en/latest/operating/#"
METRIC = re.compile(r"\bdispatch_[a-z_]+\b")


def exported_names() -> set[str]:
    """Every sample name a worker's endpoint and the metrics view can serve."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from django_dispatch.observability.metrics import (
        ClusterCollector,
        ClusterSnapshot,
        JobMetrics,
    )

    registry = CollectorRegistry(auto_describe=False)
    metrics = JobMetrics(registry)
    metrics.count("started", "t", "q")
    metrics.queue_wait.labels("t", "q").observe(1)
    metrics.run.labels("t", "q").observe(1)
    snapshot = ClusterSnapshot(taken_at=0, max_age=float("inf"), jobs=[("q", "pending", 1)])
    registry.register(ClusterCollector(lambda: snapshot))
    text = generate_latest(registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", ())]


def anchors(markdown: str) -> set[str]:
    """The ids MkDocs gives the headings (toc's default slugify)."""
    out = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().replace("`", "")
            slug = re.sub(r"[^\w\s-]", "", text).strip().lower()
            out.add(re.sub(r"[-\s]+", "-", slug))
    return out


def test_every_metric_the_rules_and_the_dashboard_name_is_exported():
    exported = exported_names()
    assert "dispatch_jobs_total" in exported and "dispatch_job_run_seconds_bucket" in exported
    used = {name for rule in rules() for name in METRIC.findall(rule["expr"])}
    used |= {name for expr in dashboard_exprs() for name in METRIC.findall(expr)}
    # Label names that look like metric names are not metrics.
    used -= {"dispatch_alias", "dispatch_namespace"}
    assert used - exported == set()


def test_every_rule_says_what_happened_and_links_its_runbook():
    documented = anchors(OPERATING.read_text())
    for rule in rules():
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        url = annotations["runbook_url"]
        assert url == RUNBOOK + rule["alert"].lower(), url
        assert rule["alert"].lower() in documented, f"docs/operating.md has no {url}"


def test_the_dashboard_has_every_panel_on_its_datasource_and_selectors():
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "alias", "namespace", "queue"}
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert 'dispatch_alias=~"$alias"' in target["expr"], panel["title"]
            assert 'dispatch_namespace=~"$namespace"' in target["expr"], panel["title"]
