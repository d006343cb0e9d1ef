"""The shapes pending: the distinct need vectors of jobs with resource needs.

A worker with capacity compares numbers, never jobs: it reads which shapes
are pending (one index probe per shape, however many jobs share it), keeps
the ones that fit, and only then reads jobs, through the resource pick
(``sources.resources``).
"""

from __future__ import annotations

import json
import time

from django.db import connections

from ...core.resources import Needs, fits
from ...core.states import JobState
from ...models import Job
from ..base import job_sql, namespace_literal
from ..types import Placement

#: The distinct shapes pending in a namespace, one index probe each: a
#: recursive skip scan of ``dispatch_job_claim_shaped`` (PostgreSQL has no
#: loose index scan of its own).
_SHAPES_SQL = """
WITH RECURSIVE shapes AS (
    (SELECT resource_shape, resources FROM {job}
     WHERE namespace = {namespace} AND state = {pending} AND resource_shape IS NOT NULL
     ORDER BY resource_shape LIMIT 1)
    UNION ALL
    SELECT next.resource_shape, next.resources FROM shapes, LATERAL (
        SELECT resource_shape, resources FROM {job}
        WHERE namespace = {namespace} AND state = {pending}
            AND resource_shape > shapes.resource_shape
        ORDER BY resource_shape LIMIT 1
    ) AS next
)
SELECT resource_shape, resources FROM shapes
"""


#: Longest a busy worker goes on with the shapes it read (``ShapeCache``).
SHAPES_TTL = 1.0


class ShapeCache:
    """The shapes pending, as a worker last read them, for up to ``ttl`` seconds.

    Why: a busy worker claims many times a second, and the shapes change
    rarely. A claim that finds nothing reads them again at once (``fresh``),
    so an idle worker sees a new shape immediately; a busy one within ``ttl``.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.read_at = -float("inf")
        self.shapes: dict[int, Needs] = {}
        #: Until when no job is starved, as far as this worker knows (``_starved``).
        self.none_starved_until = -float("inf")

    def get(self, db: str, namespace: str, *, fresh: bool = False) -> tuple[dict[int, Needs], bool]:
        """(shapes, whether they were read just now)."""
        now = time.monotonic()
        if fresh or now - self.read_at > self.ttl:
            self.shapes, self.read_at = pending_shapes(db, namespace), now
            return self.shapes, True
        return self.shapes, False


def pending_shapes(db: str, namespace: str) -> dict[int, Needs]:
    """{shape id: needs} of the jobs with needs pending in ``namespace``."""
    connection = connections[db]
    if connection.vendor == "postgresql":
        sql = job_sql(connection, _SHAPES_SQL).format(namespace=namespace_literal(namespace))
        with connection.cursor() as cursor:
            cursor.execute(sql)
            rows = cursor.fetchall()
        return {
            shape: (needs if isinstance(needs, dict) else _json(needs)) for shape, needs in rows
        }
    # The same skip scan in the ORM: one descent per shape (a DISTINCT read
    # every pending job with needs, deferred ones included).
    shaped = Job.objects.using(db).filter(
        namespace=namespace, state=JobState.PENDING, resource_shape__isnull=False
    )
    shapes: dict[int, Needs] = {}
    after: int | None = None
    while True:
        rest = shaped if after is None else shaped.filter(resource_shape__gt=after)
        first = rest.order_by("resource_shape").values_list("resource_shape", "resources").first()
        if first is None:
            return shapes
        shape, needs = first
        assert shape is not None  # resource_shape__isnull=False
        if needs:
            shapes[shape] = needs
        after = shape


def _json(text: str) -> Needs:
    return json.loads(text)


def shapes_could_run(db: str, namespace: str, placement: Placement | None) -> list[int]:
    """The pending shapes a worker could ever hold (``--burst`` asks whether any
    job is due): those that fit its whole capacity; none without capacity."""
    if placement is None or not placement.capacity:
        return []
    shapes = pending_shapes(db, namespace)
    return [shape for shape, needs in shapes.items() if fits(needs, placement.capacity)]
