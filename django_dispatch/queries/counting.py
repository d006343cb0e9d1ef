"""Counts that stay cheap on a history of millions of rows.

``COUNT(*)`` reads every matching row: on 10,000,000 finished jobs, a count
of one queue's jobs reads millions of index entries, seconds of work each
time a dashboard asks. So the counting functions (``jobs.count``,
``dead_letters.count``, ``workflows.count_runs``) answer exactly only up to
``DISPATCH["COUNT_EXACT_MAX"]`` rows; above that, on PostgreSQL, they answer
the planner's estimate of the matching rows (from the statistics ``ANALYZE``
keeps, autovacuum's and ours): "about N", whatever the size of the history.
``exact=True`` always counts.

Rows are counted first, through a ``LIMIT`` of one past the cap, so a
count under the cap is always exact and reads at most the cap's rows: the
planner's estimate is never trusted where a small number is the answer (a
drained backlog's statistics can still say 400,000 pending; filters that
never go together are estimated as if independent). Only a count past the
cap answers the planner's estimate; an estimate below what the probe saw is
known stale (rows added since the last ANALYZE), and that count is then
made exactly.

On PostgreSQL the probe and the estimate are one statement:
``EXPLAIN (ANALYZE) SELECT pk … LIMIT cap + 1`` runs the probe (the
``Limit`` node's actual rows are the rows counted) and shows the plan it
ran (its input's planned rows are the estimate of every matching row). A
probe and a separate ``EXPLAIN`` planned the query twice and took two
round trips; an ``EXPLAIN ANALYZE`` sends no rows back, so no ``COUNT``
aggregate handles each of the cap's rows either.

A probe walks an index, never the table: a sequential scan of a table
larger than a quarter of ``shared_buffers`` reads through a small ring of
buffers (and may start wherever another scan of the table is), so its pages
come from the OS on every call, where an index's pages stay cached and,
once the table is vacuumed, no row is visited. Where the planner would
rather scan the table (a filter that every row matches, such as one
namespace's workflow runs), the caller gives ``index_order``, the columns of
the index to walk: ordered so, the probe's ``LIMIT`` is reached by that
index, and a scan of the table would have to sort it whole first.

The live jobs are never estimated (``queries.lists.jobs_count`` counts them
exactly, through their partial indexes): their states change far faster
than the statistics are refreshed.

SQLite has no row estimates to read, and its databases are small: its
counts are always exact.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Model, QuerySet

from ..conf import get_settings

__all__ = ["bounded_count", "capped_count", "estimated_rows", "probe"]


def bounded_count(
    rows: QuerySet[Any], *, exact: bool = False, index_order: Sequence[str] = ()
) -> int:
    """How many rows ``rows`` matches: exact up to ``COUNT_EXACT_MAX``, else about.

    ``index_order``: see ``probe``."""
    if exact:
        return rows.count()
    cap = get_settings().COUNT_EXACT_MAX
    counted, estimate = probe(rows, cap, index_order)
    if counted <= cap:
        return counted
    if estimate is None or estimate < counted:  # SQLite, or statistics known stale
        return rows.count()
    return estimate


def capped_count(rows: QuerySet[Any], cap: int) -> tuple[int, bool]:
    """``(count, capped)``: the rows ``rows`` matches counted up to ``cap``, and
    whether there are more (the admin's "more than" count).

    Always through a ``LIMIT`` of one past the cap, never from the planner's
    estimate, which can say "more than" over an empty page.
    """
    counted, _ = probe(rows, cap)
    return min(counted, cap), counted > cap


def probe(rows: QuerySet[Any], cap: int, index_order: Sequence[str] = ()) -> tuple[int, int | None]:
    """``(counted, estimate)``: the rows ``rows`` matches, counted up to ``cap + 1``,
    and the planner's estimate of them all (PostgreSQL; None elsewhere), read in
    one statement (see the module docstring). ``index_order``: the columns of
    the index the probe must walk, in its order, where the planner would scan
    the table instead (the rows counted are the same in any order)."""
    if rows.query.is_empty():  # ``.none()``: Django runs no statement
        return 0, 0
    if connections[rows.db].vendor != "postgresql":
        return rows.order_by().values("pk")[: cap + 1].count(), None
    limited = rows.order_by(*index_order).values("pk")[: cap + 1]
    try:
        sql, params = limited.query.get_compiler(using=rows.db).as_sql()
    except EmptyResultSet:  # a filter that matches nothing, such as ``pk__in=[]``
        return 0, 0
    with connections[rows.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, TIMING OFF, SUMMARY OFF, FORMAT JSON) {sql}", params)
        plan = _top(cursor.fetchone())
    # The Limit's input is its "Outer" child: InitPlans (an uncorrelated
    # subquery in a filter) are listed beside it, often first.
    outer = [p for p in plan.get("Plans", ()) if p.get("Parent Relationship") == "Outer"]
    if plan.get("Node Type") != "Limit" or len(outer) != 1:
        # Not the plan this reads (no such plan is known): count as Django would.
        return rows.order_by().values("pk")[: cap + 1].count(), None
    # Rows per loop times loops: PostgreSQL 18 shows the first as a fraction.
    counted = round(float(plan["Actual Rows"]) * float(plan.get("Actual Loops", 1)))
    return counted, int(outer[0]["Plan Rows"])


def estimated_rows[M: Model](rows: QuerySet[M]) -> int | None:
    """The planner's estimate of the rows ``rows`` matches (PostgreSQL), else None."""
    if connections[rows.db].vendor != "postgresql":
        return None
    if rows.query.is_empty():  # ``.none()``: Django runs no statement, EXPLAIN neither
        return 0
    try:
        explained = rows.order_by().values("pk").explain(format="json")
    except EmptyResultSet:  # a filter that matches nothing, such as ``pk__in=[]``
        return 0
    if not explained:
        return 0
    plan: Any = json.loads(explained)
    return int(plan[0]["Plan"]["Plan Rows"])


def _top(row: Any) -> dict[str, Any]:
    """The top plan node of an ``EXPLAIN (FORMAT JSON)`` result row (text or parsed)."""
    explained = row[0]
    if isinstance(explained, (str, bytes)):
        explained = json.loads(explained)
    return dict(explained[0]["Plan"])
