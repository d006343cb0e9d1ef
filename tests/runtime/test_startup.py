"""What a fresh worker does before its first claim, and what it leaves for later.

The migrations check answers from the recorded migrations when all are
applied (the full plan only when that finds a gap); the leader's
housekeeping waits a few seconds after start, or runs on its way out.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings
from django.utils import timezone

from django_dispatch import store
from django_dispatch.checks import database
from django_dispatch.conf import get_settings
from django_dispatch.models import Job
from django_dispatch.runtime import maintenance as maintenance_module
from django_dispatch.runtime.maintenance import HOUSEKEEPING_DELAY, Maintenance
from django_dispatch.testing import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_all_migrations_applied_is_answered_without_planning(monkeypatch):
    def no_plan(*args, **kwargs):
        raise AssertionError("planned although every migration is recorded")

    monkeypatch.setattr(database, "MigrationExecutor", no_plan)
    assert database.unapplied_migrations(store.db_alias()) == []


def test_a_migration_not_recorded_is_found_by_the_full_plan():
    db = store.db_alias()
    latest = max(database._migration_names())
    # Inside the test's transaction: rolled back with it.
    MigrationRecorder(connection).migration_qs.filter(app="django_dispatch", name=latest).delete()
    assert database.unapplied_migrations(db) == [latest]


def test_migration_names_follow_migration_modules():
    names = database._migration_names()
    assert "0001_initial" in names and not any(n.startswith("_") for n in names)
    with override_settings(MIGRATION_MODULES={"django_dispatch": None}):
        assert database._migration_names() == set()  # disabled: the full plan decides
    with override_settings(MIGRATION_MODULES={"django_dispatch": "no.such.module"}):
        assert database._migration_names() == set()


def _due(duties, at: float) -> list[str]:
    return [getattr(d.run, "__name__", "tick") for d in duties if d.next_at <= at]


def test_only_the_election_and_cron_run_before_the_first_claim():
    cfg = replace(get_settings(), RECLAIM_INTERVAL=10.0, PURGE_INTERVAL=60.0)
    duties = Maintenance("w", cfg, store.db_alias()).duties(cron=True)
    now = time.monotonic()
    assert sorted(_due(duties, now)) == ["<lambda>", "elect"]
    later = _due(duties, now + HOUSEKEEPING_DELAY + 0.1)
    assert {"purge", "unstick_partitions", "sweep_artifacts"} <= set(later)
    assert "reclaim" not in later  # its interval: the election reclaims on taking office
    assert "reclaim" in _due(duties, now + 10.1)


def test_a_short_purge_interval_is_kept_at_start():
    cfg = replace(get_settings(), PURGE_INTERVAL=1.0)
    duties = Maintenance("w", cfg, store.db_alias()).duties(cron=False)
    assert "purge" in _due(duties, time.monotonic() + 1.05)


def _old_succeeded_job() -> int:
    result = tasks.add.enqueue(1, 1)
    drain()
    Job.objects.filter(pk=result.id).update(finished_at=timezone.now() - timedelta(days=30))
    return int(result.id)


@pytest.mark.django_db(transaction=True)
def test_a_leader_that_stops_before_its_housekeeping_purges_on_the_way_out():
    job = _old_succeeded_job()
    leader = Maintenance("leader", get_settings(), store.db_alias())
    assert leader.elect() is True
    assert Job.objects.filter(pk=job).exists()  # the election itself purges nothing
    leader.resign()
    assert not Job.objects.filter(pk=job).exists()
    assert store.leadership_acquire("next", ttl=30, db=store.db_alias(), namespace="")


@pytest.mark.django_db(transaction=True)
def test_housekeeping_runs_once_per_term_not_again_at_resign(monkeypatch):
    leader = Maintenance("leader", get_settings(), store.db_alias())
    assert leader.elect() is True
    leader.purge()
    calls = []
    monkeypatch.setattr(maintenance_module, "purge_past_retention", lambda *a, **k: calls.append(1))
    leader.resign()
    assert calls == []
    follower = Maintenance("follower", get_settings(), store.db_alias())
    follower.resign()  # never the leader: purges nothing
    assert calls == []


@pytest.mark.django_db(transaction=True)
def test_a_failed_housekeeping_on_the_way_out_still_lets_go_of_the_leadership(monkeypatch):
    leader = Maintenance("leader", get_settings(), store.db_alias())
    assert leader.elect() is True

    def broken(*args, **kwargs):
        raise RuntimeError("purge failed")

    monkeypatch.setattr(maintenance_module, "purge_past_retention", broken)
    leader.resign()
    assert leader.leader is False
    assert store.leadership_acquire("next", ttl=30, db=store.db_alias(), namespace="")
