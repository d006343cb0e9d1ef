"""The resource pick, a claim source: which jobs fit this worker.

Used only by a worker with ``--capacity`` or ``--locality``: every other
worker claims through the plain sources (``sources.orm``, ``sources.fused_pg``), which reads the
claim index of jobs *without* needs only, so a backlog of big jobs never
slows it down, and it never takes one.

How a worker with capacity reads only jobs that fit:

1. The distinct *shapes* pending (``pending_shapes``): a skip scan of the
   index ``dispatch_job_claim_shaped`` (led by the shape), one index probe
   per distinct need vector, however many jobs share each.
2. The shapes whose needs fit the worker's *free* capacity (its capacity
   minus what its running jobs hold), compared in Python.
3. One priority at a time, highest first (so that each priority's sources
   merge in claim order; deferred jobs are ``scheduled``, not read): the
   first ``window`` due jobs of each source (jobs without needs, each
   fitting shape, and the worker's own locality), each through its index,
   merged in claim order (priority, own
   locality first, run_after, id) and only then cut to ``window``; those rows
   are locked (SKIP LOCKED). A job that does not fit is never read, let alone
   written.
4. The placement gate (``gates.placement``) then keeps, greedily in that order, the jobs that fit
   *together*; the others stay locked only until the claim commits, unchanged.

Starvation (``starving``): while a job with needs that fit this worker's
*total* capacity, but not what is free now, has waited past
``DISPATCH["RESOURCE_STARVATION_SECONDS"]``, the worker claims nothing else;
its running jobs finish, the room grows, and the big job is claimed first
as soon as it fits. So the big job waits at most the threshold plus the
longest running job's duration, however many small jobs keep coming.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import connections
from django.db.models.functions import Now

from ...core.resources import Needs, fits
from ...core.states import JobState
from ...models import Job
from ..base import job_sql, namespace_literal, pending_priorities
from ..types import Placement
from .shapes import pending_shapes


def candidates(
    db: str,
    queues: Sequence[str],
    window: int,
    exclude: Sequence[int],
    *,
    namespace: str,
    placement: Placement,
    fields: Sequence[str],
    paused: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Up to ``window`` runnable jobs that each fit ``placement``, in claim order, locked.

    The claim order here is priority, then the worker's own locality first,
    then run_after, then id; the cut to ``window`` comes after that order.
    """
    shapes: dict[int, Needs]
    if not placement.capacity:
        shapes, fresh = {}, True
    elif placement.cache is not None:
        shapes, fresh = placement.cache.get(db, namespace)
    else:
        shapes, fresh = pending_shapes(db, namespace), True
    args = (db, queues, window, exclude, namespace, placement, fields, paused)
    rows = _candidates(*args, shapes)
    if not rows and not fresh and placement.cache is not None:  # a shape new since?
        rows = _candidates(*args, placement.cache.get(db, namespace, fresh=True)[0])
    return rows


def _candidates(
    db: str,
    queues: Sequence[str],
    window: int,
    exclude: Sequence[int],
    namespace: str,
    placement: Placement,
    fields: Sequence[str],
    paused: Sequence[str],
    shapes: dict[int, Needs],
) -> list[dict[str, Any]]:
    base = Job.objects.using(db).filter(
        namespace=namespace, state=JobState.PENDING, run_after__lte=Now()
    )
    if queues:
        base = base.filter(queue_name__in=list(queues))
    if exclude:
        base = base.exclude(id__in=list(exclude))
    if paused:
        base = base.exclude(queue_name__in=list(paused))
    ours = [shape for shape, needs in shapes.items() if fits(needs, placement.capacity)]
    starved = _starved(base, ours, placement, namespace)
    first: list[dict[str, Any]] = []
    if starved is not None:
        if not fits(starved["resources"], placement.free):
            return []  # hold back: nothing else until it fits ...
        # ... then it first, and after it what the window holds as usual
        # (the placement gate keeps only what fits beside it). Not it alone:
        # in a backlog older than the threshold *every* job is "starved", and
        # one job per claim would cut a deep backlog's drain to a trickle.
        first = _lock(db, [starved["id"]], fields)
        exclude = [*exclude, starved["id"]]
        base = base.exclude(id=starved["id"])
        window -= len(first)
    if window <= 0:
        return first
    fitting = [shape for shape in ours if fits(shapes[shape], placement.free)]
    if connections[db].vendor == "postgresql":
        rows = _pick_pg(db, queues, window, exclude, namespace, placement, fields, paused, fitting)
        return first + rows
    return first + _pick_orm(db, base, window, namespace, placement, fitting, fields)


def _pick_orm(
    db: str,
    base: Any,
    window: int,
    namespace: str,
    placement: Placement,
    fitting: list[int],
    fields: Sequence[str],
) -> list[dict[str, Any]]:
    """``_PICK_SQL`` in the ORM (SQLite): one priority at a time, highest first, as
    the statement walks them; a priority's picks come before any of a lower one."""
    sources = [base.filter(resource_shape__isnull=True)]
    sources += [base.filter(resource_shape=shape) for shape in fitting]
    if placement.locality:  # the worker's own jobs, one index range each
        sources += [source.filter(locality=placement.locality) for source in list(sources)]
    # Lazy: a descent when asked.
    walks = [pending_priorities(db, namespace, shape) for shape in [None, *fitting]]
    picked: dict[int, tuple[Any, ...]] = {}
    for priority, _ in itertools.groupby(heapq.merge(*walks, reverse=True)):
        if len(picked) >= window:
            break
        for source in sources:
            for job_id, run_after, locality in (
                source.filter(priority=priority)
                .order_by("run_after", "id")
                .values_list("id", "run_after", "locality")[:window]
            ):
                mine = 0 if placement.locality and locality == placement.locality else 1
                picked[job_id] = (-priority, mine, run_after, job_id)
    return _lock(db, [key[3] for key in sorted(picked.values())[:window]], fields)


def _starved(
    base: Any, shapes: list[int], placement: Placement, namespace: str
) -> dict[str, Any] | None:
    """The oldest job of ``shapes`` (those this worker could ever hold) that has
    waited past the starvation threshold, or None.

    A worker (one with a ``ShapeCache``) keeps an answer of "none" for a
    tenth of the threshold (at most a second): a job turns starved only after
    waiting the whole threshold, so noticing it that much later moves the
    bound by as little, while a busy worker stops paying this query on every
    claim (a fifth of its CPU, profiled with 20,000 jobs of mixed sizes).
    """
    cache = placement.cache
    if not shapes:
        return None
    now = time.monotonic()
    if cache is not None and cache.none_starved_until > now:
        return None
    threshold = Now() - timedelta(seconds=placement.starvation_seconds)
    # Per shape and priority, the oldest: run_after bounds each index range, so
    # neither deferred jobs nor the rest of a backlog are read.
    oldest: list[dict[str, Any]] = []
    for shape in shapes:
        for priority in pending_priorities(base.db, namespace, shape):
            first = (
                base.filter(resource_shape=shape, priority=priority, run_after__lte=threshold)
                .order_by("run_after", "id")
                .values("id", "resources", "run_after")
                .first()
            )
            if first is not None:
                oldest.append(first)
    row = min(oldest, key=lambda r: (r["run_after"], r["id"]), default=None)
    if row is None and cache is not None:
        cache.none_starved_until = now + min(1.0, placement.starvation_seconds / 10)
    return row


def _lock(db: str, ids: list[int], fields: Sequence[str]) -> list[dict[str, Any]]:
    """Lock the rows of ``ids`` still pending (SKIP LOCKED), in the order of ``ids``."""
    if not ids:
        return []
    rows = list(
        Job.objects.using(db)
        .filter(id__in=ids, state=JobState.PENDING)
        .select_for_update(skip_locked=True)
        .annotate(db_now=Now())
        .values(*fields, "db_now")
    )
    rank = {job_id: i for i, job_id in enumerate(ids)}
    rows.sort(key=lambda row: rank[row["id"]])
    return rows


#: ``candidates`` on PostgreSQL, in one statement, one priority at a time, so
#: that each priority's sources merge in claim order (deferred jobs are
#: ``scheduled``, outside these indexes). ``priorities``: the pending
#: priorities of the jobs without needs and of each fitting shape, highest
#: first, one index descent per source and priority (GREATEST ignores a
#: source that has none left). Then, per priority
#: until ``window`` jobs are picked: the first ``window`` due jobs of each
#: source (jobs without needs, each fitting shape through LATERAL, the
#: worker's locality), each an index range bounded by the priority and
#: ``run_after``, merged (own locality first, run_after, id) and cut; the
#: picked rows are then locked (SKIP LOCKED). No job that does not fit is read.
_PICK_SQL = """
WITH RECURSIVE priorities AS (
    SELECT GREATEST(
        (SELECT priority FROM {job}
         WHERE namespace = {namespace} AND state = {pending} AND resource_shape IS NULL
         ORDER BY priority DESC LIMIT 1),
        (SELECT max(top.priority) FROM unnest(%(shapes)s::bigint[]) AS s(shape)
         CROSS JOIN LATERAL (
             SELECT priority FROM {job}
             WHERE namespace = {namespace} AND state = {pending} AND resource_shape = s.shape
             ORDER BY priority DESC LIMIT 1
         ) AS top)
    ) AS priority
    UNION ALL
    SELECT GREATEST(
        (SELECT lower.priority FROM {job} AS lower
         WHERE lower.namespace = {namespace} AND lower.state = {pending}
             AND lower.resource_shape IS NULL AND lower.priority < p.priority
         ORDER BY lower.priority DESC LIMIT 1),
        (SELECT max(top.priority) FROM unnest(%(shapes)s::bigint[]) AS s(shape)
         CROSS JOIN LATERAL (
             SELECT lower.priority FROM {job} AS lower
             WHERE lower.namespace = {namespace} AND lower.state = {pending}
                 AND lower.resource_shape = s.shape AND lower.priority < p.priority
             ORDER BY lower.priority DESC LIMIT 1
         ) AS top)
    )
    FROM priorities AS p WHERE p.priority IS NOT NULL
), picked AS (
    SELECT due.id FROM priorities AS p CROSS JOIN LATERAL (
        SELECT c.id FROM (
            (SELECT id, run_after, locality FROM {job}
             WHERE namespace = {namespace} AND state = {pending} AND resource_shape IS NULL
                 AND priority = p.priority AND run_after <= now() {filters}
             ORDER BY run_after, id LIMIT %(window)s)
            UNION
            SELECT j.id, j.run_after, j.locality
            FROM unnest(%(shapes)s::bigint[]) AS s(shape) CROSS JOIN LATERAL (
                SELECT id, run_after, locality FROM {job}
                WHERE namespace = {namespace} AND state = {pending} AND resource_shape = s.shape
                    AND priority = p.priority AND run_after <= now() {filters}
                ORDER BY run_after, id LIMIT %(window)s
            ) AS j
            {local}
        ) AS c
        ORDER BY COALESCE(c.locality = %(locality)s::text, false) DESC, c.run_after, c.id
        LIMIT %(window)s
    ) AS due
    LIMIT %(window)s
)
SELECT {fields}, locality AS claim_locality, now() AS db_now FROM {job}
WHERE id IN (SELECT id FROM picked) AND state = {pending}
FOR UPDATE SKIP LOCKED
"""
_LOCAL_SQL = """
            UNION
            (SELECT id, run_after, locality FROM {job}
             WHERE namespace = {namespace} AND state = {pending} AND locality = %(locality)s::text
                 AND (resource_shape IS NULL OR resource_shape = ANY(%(shapes)s::bigint[]))
                 AND priority = p.priority AND run_after <= now() {filters}
             ORDER BY run_after, id LIMIT %(window)s)"""


def _pick_pg(
    db: str,
    queues: Sequence[str],
    window: int,
    exclude: Sequence[int],
    namespace: str,
    placement: Placement,
    fields: Sequence[str],
    paused: Sequence[str],
    shapes: list[int],
) -> list[dict[str, Any]]:
    connection = connections[db]
    filters = ""
    if queues:
        filters += " AND queue_name = ANY(%(queues)s)"
    if exclude:
        filters += " AND NOT (id = ANY(%(exclude)s))"
    if paused:
        filters += " AND NOT (queue_name = ANY(%(paused)s))"
    local = _LOCAL_SQL if placement.locality else ""
    sql = (
        job_sql(connection, _PICK_SQL.replace("{local}", local))
        .replace("{filters}", filters)
        .format(fields=", ".join(fields), namespace=namespace_literal(namespace))
    )
    params: dict[str, Any] = {
        "window": window,
        "shapes": shapes,
        "locality": placement.locality,
        "queues": list(queues),
        "exclude": list(exclude),
        "paused": list(paused),
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        names = [column.name for column in cursor.description]
        rows = [dict(zip(names, record, strict=True)) for record in cursor.fetchall()]
    for row in rows:
        for name in _json_fields(tuple(fields)):
            if isinstance(row[name], str):
                row[name] = json.loads(row[name])
    mine = placement.locality

    def order(row: dict[str, Any]) -> tuple[Any, ...]:
        local = 0 if mine and row["claim_locality"] == mine else 1
        return (-row["priority"], local, row["run_after"], row["id"])

    rows.sort(key=order)
    for row in rows:
        del row["claim_locality"]
    return rows


@functools.lru_cache(maxsize=8)
def _json_fields(fields: tuple[str, ...]) -> list[str]:
    return [name for name in fields if Job._meta.get_field(name).get_internal_type() == "JSONField"]
