"""Helpers shared by the store tests."""

import json
from contextlib import contextmanager

from django.db import transaction

from django_dispatch import store
from django_dispatch.models import Job
from django_dispatch.runtime import flow_cache


def claim(worker="w1", limit=10, queues=(), lease=30.0):
    return store.jobs_claim(worker_id=worker, queues=queues, limit=limit, lease_seconds=lease)


def claim_as_worker(worker="w", limit=10, queues=(), poll_interval=1.0):
    """A claim as a worker makes it: with the flow state its process keeps
    (refreshed once per ``poll_interval``), and the notes it writes back."""
    return flow_cache.jobs_claim(
        worker_id=worker,
        queues=queues,
        limit=limit,
        lease_seconds=30,
        db=store.db_alias(),
        namespace="",
        max_age=poll_interval,
    )


@contextmanager
def statements(connection):
    """Every statement run on ``connection`` meanwhile, as ``(sql, params)`` the
    store wrote them: before any binding, so that a statement bound on the
    server (its logged SQL has ``$1``) can be run again under EXPLAIN."""
    seen = []

    def capture(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        yield seen


def most_rows_read(connection, seen) -> tuple[int, str]:
    """The most job-table rows any of the ``seen`` reads and writes scans, and
    its SQL, from ``EXPLAIN ANALYZE`` of each (inside a rolled-back transaction)."""
    worst, where = 0, ""
    with transaction.atomic(using=connection.alias):
        with connection.cursor() as cursor:
            for sql, params in seen:
                if not sql.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE")):
                    continue
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                plan = cursor.fetchone()[0]
                plan = plan if isinstance(plan, list) else json.loads(plan)
                read = _rows_read(plan[0]["Plan"])
                if read > worst:
                    worst, where = read, sql
        transaction.set_rollback(True, using=connection.alias)
    return worst, where


def _rows_read(node) -> int:
    """Rows produced by scans of the job table anywhere in a plan (times loops)."""
    own = 0
    if node.get("Relation Name") == Job._meta.db_table:
        own = int(node.get("Actual Rows", 0) * node.get("Actual Loops", 1))
        own += int(node.get("Rows Removed by Filter", 0) * node.get("Actual Loops", 1))
    return own + sum(_rows_read(child) for child in node.get("Plans", []))
