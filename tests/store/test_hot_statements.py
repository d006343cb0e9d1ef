"""The worker's hot statements (the claim, a wave's finish) on PostgreSQL: bound on
the server, and prepared once per session where the site allows prepared
statements (psycopg's ``prepare_threshold``), never where it does not.

Prepared, a statement is no longer planned at each run: its results must
stay those of a planned run, however often it is run and whatever the
parameters (a generic plan is chosen after five runs).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from django_dispatch import store
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from tests.conftest import postgres_only
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def _drain_in_waves(count: int, per_wave: int) -> list[int]:
    """Claim and finish ``count`` jobs, ``per_wave`` at a time; the ids in claim order."""
    order = []
    for _ in range(count // per_wave):
        with transaction.atomic():
            claimed = store.jobs_claim(
                worker_id="w-hot", queues=(), limit=per_wave, lease_seconds=30
            )
            won = store.jobs_finish_many_if_leased([(c.lease, c.id * 2) for c in claimed])
        assert won == {c.id for c in claimed}
        order += [c.id for c in claimed]
    return order


@pytest.fixture
def prepared_statements():
    """This test's connection with psycopg's prepared statements on (at once)."""
    connection.ensure_connection()
    connection.connection.prepare_threshold = 0
    try:
        yield
    finally:
        connection.close()  # a fresh session for the next test: none prepared


def test_hot_statements_are_prepared_where_the_site_allows_it(prepared_statements):
    ids = [int(tasks.add.enqueue(i, i).id) for i in range(40)]
    tasks.add.using(priority=5).enqueue(0, 0)  # claimed first, though enqueued last
    order = _drain_in_waves(41, per_wave=1)
    assert order[0] == ids[-1] + 1 and order[1:] == ids  # claim order, run after run
    statements = _prepared()
    assert any("FOR UPDATE SKIP LOCKED" in s for s in statements), statements
    assert any("unnest(" in s for s in statements), statements
    done = Job.objects.filter(state=JobState.SUCCEEDED)
    assert done.count() == 41
    assert all(j.return_value == j.id * 2 for j in done)


def test_nothing_is_prepared_by_default():
    connection.ensure_connection()
    assert connection.connection.prepare_threshold is None  # Django's default
    for i in range(12):
        tasks.add.enqueue(i, i)
    assert len(_drain_in_waves(12, per_wave=2)) == 12
    assert _prepared() == []


def test_hot_statements_load_timestamps_as_django_does():
    """The claim's timestamps come through psycopg's own loader (with the session in
    UTC): the same aware values, in timezone.utc, as Django's cursor gives."""
    enqueued = tasks.add.using(run_after=datetime.now(UTC) - timedelta(seconds=5)).enqueue(1, 1)
    (claimed,) = store.jobs_claim(worker_id="w-tz", queues=(), limit=1, lease_seconds=30)
    job = Job.objects.get(pk=enqueued.id)
    for name in ("enqueued_at", "run_after", "deferred_until"):
        assert claimed.row[name] == getattr(job, name), name
        assert claimed.row[name].tzinfo is UTC, name
    assert claimed.claimed_at.tzinfo is UTC
    with connection.cursor() as cursor:  # Django's own cursors keep Django's loader
        cursor.execute("SELECT now()")
        assert cursor.fetchone()[0].tzinfo is UTC
