"""The values the store takes and hands back: leases, claimed jobs, specs, what a
worker brings to its claim.

Plain dataclasses, no queries: the runtime builds the ones it passes in
(``Placement``, ``FlowState``) and keeps the ones it gets back (``Lease``,
``ClaimedJob``) to fence its later writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import Field

from ..conf import QueueLimit, size_limit
from ..core.limits import call_sizes, too_large
from ..core.resources import Needs, minus
from ..models import Job

if TYPE_CHECKING:
    from .sources.shapes import ShapeCache


@dataclass(frozen=True, slots=True)
class Lease:
    """The token a claim hands out; every later write by the worker carries it.

        ``partition_key`` is the job's key, carried along (not part of the fence,
        nor of equality) so that a batch of completions can take its keys' locks
        before its UPDATE (see ``partitions``). A lease built without it is an
        unkeyed job's as far as ``jobs_finish_many_if_leased`` knows; one built
    without ``namespace`` is a job of the default namespace's.
    """

    job_id: int
    worker_id: str
    epoch: int
    partition_key: str | None = field(default=None, compare=False)
    #: The job's namespace, carried like ``partition_key``: the transitions
    #: that free a key promote its head in this namespace only.
    namespace: str = field(default="", compare=False)


#: Columns a worker needs to run a job; read in the claim so that running a
#: job costs no further SELECT.
CLAIM_FIELDS = (
    "id",
    "task_path",
    "backend",
    "queue_name",
    "priority",
    "run_after",
    "args",
    "kwargs",
    "deferred_until",
    "partition_key",
    "idempotency_key",
    "attempts",
    "max_attempts",
    "worker_lost_count",
    "lease_epoch",
    "checkpoint",
    "errors",
    "worker_ids",
    "enqueued_at",
    "started_at",
    "trace_context",
    "call_context",
    "resources",
    "concurrency_key",  # concurrency and rate limits (the limits gate)
    "concurrency_limit",
    "rate_limit",
    "rate_period",
)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job as it stands right after this worker's claim committed."""

    lease: Lease
    row: dict[str, Any]  # CLAIM_FIELDS, with the claim's own updates applied
    claimed_at: datetime  # database clock

    @property
    def id(self) -> int:
        return self.lease.job_id


@dataclass(frozen=True, slots=True)
class JobSpec:
    """The columns all enqueues of one task share, already in their stored form.

    Built once per task by the backend (see ``tasks.registry.DispatchBackendBase.enqueue_plan``);
    only ``args`` and ``kwargs`` differ between calls.
    """

    task_path: str
    backend: str
    queue_name: str
    priority: int
    deferred_until: datetime | None
    partition_key: str | None
    idempotency_key: str | None
    max_attempts: int
    #: The backend's ``OPTIONS["NAMESPACE"]`` (``""``: the default namespace).
    namespace: str = ""
    #: ``@task(concurrency_limit=...)``; a spec with one is inserted
    #: through the ORM, keeping the raw INSERT of plain jobs as it was.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_limit: int | None = None
    rate_period: int | None = None
    partition_yield: bool = False
    #: Resource needs, their shape and the locality (see ``tasks.placement``);
    #: a spec with any of them is inserted through the ORM.
    resources: dict[str, int] | None = None
    resource_shape: int | None = None
    locality: str | None = None

    @classmethod
    def of(cls, **values: Any) -> JobSpec:
        """A spec whose values went through their model fields' ``get_prep_value``.

        So that raw SQL stores exactly what the ORM would (``str`` for the
        char columns, ``int`` for the integer ones).
        """
        fields: dict[str, Field[Any, Any]] = {f.name: f for f in Job._meta.concrete_fields}
        return cls(**{name: fields[name].get_prep_value(v) for name, v in values.items()})

    def new_job(self, args: Any, kwargs: Any, call_context: tuple[str, Any] | None = None) -> Job:
        """An unsaved pending Job of this spec; ``call_context``: (JSON text, value) or None."""
        job = Job(
            namespace=self.namespace,
            task_path=self.task_path,
            backend=self.backend,
            queue_name=self.queue_name,
            priority=self.priority,
            args=args,
            kwargs=kwargs,
            deferred_until=self.deferred_until,
            partition_key=self.partition_key,
            idempotency_key=self.idempotency_key,
            max_attempts=self.max_attempts,
        )
        if self.deferred_until is not None:
            job.run_after = self.deferred_until
        if call_context is not None:  # a copy: the batch's jobs must not share one dict
            job.call_context = json.loads(call_context[0])
        if self.partition_yield:
            job.partition_yield = True
        if self.concurrency_key is not None:  # a flow-limited job
            job.concurrency_key = self.concurrency_key
            job.concurrency_limit = self.concurrency_limit
            job.rate_limit, job.rate_period = self.rate_limit, self.rate_period
        if self.resources is not None or self.locality is not None:
            job.resources, job.resource_shape = self.resources, self.resource_shape
            job.locality = self.locality
        return job


@dataclass(frozen=True, slots=True)
class CallChunk:
    """Some calls of one task: ``text`` is a JSON array of ``[args, kwargs]``
    pairs, ``values`` the same array decoded (one fresh list per call).

    A chunk holding a call whose arguments are over
    ``DISPATCH["MAX_ARGS_BYTES"]`` cannot be made (InvalidTaskArguments), so
    no such call is ever inserted. A chunk's text is at least as long as any
    of its calls', so the check is one comparison unless the whole chunk is
    over the limit.
    """

    text: str
    values: list[list[Any]]

    def __post_init__(self) -> None:
        limit = size_limit("MAX_ARGS_BYTES")
        if len(self.text) <= limit:
            return
        for size in call_sizes(self.text, self.values):
            if size > limit:
                raise too_large("The arguments of one of the calls", size, "MAX_ARGS_BYTES", limit)


@dataclass
class Placement:
    """What a worker brings to its claim: its capacity, locality, and what it holds."""

    capacity: Needs = field(default_factory=dict)
    locality: str | None = None
    held: Needs = field(default_factory=dict)
    starvation_seconds: float = 60.0
    #: The worker's ``ShapeCache`` (None: read the shapes at every claim).
    cache: ShapeCache | None = None

    @property
    def free(self) -> Needs:
        return minus(self.capacity, self.held)


@dataclass(slots=True)
class FlowState:
    """What the claim must know of flow control, as the caller knows it.

    ``paused``: the namespace's paused queues; ``waiting``: whether any
    concurrency group has jobs set aside (the claim then promotes first);
    ``limits``: the queues with ``DISPATCH["QUEUES"]`` limits. A worker keeps
    one per namespace, refreshed once per poll interval and at once when a
    pause is announced (``runtime.flow_cache``), so a claim costs no extra
    query for it; a caller without one gets a fresh read (``flow.flow_state_read``).

    The claim writes back what it learnt: it sets ``waiting`` when it sets jobs
    aside and clears it when the last group stops waiting, so the worker's
    next claims promote (or stop promoting) without waiting for a refresh.
    """

    paused: frozenset[str] = frozenset()
    waiting: bool = False
    limits: Mapping[str, QueueLimit] = field(default_factory=dict)


#: Where the claim gets its ``FlowState``: ``source(db, namespace)``, called
#: inside the claim's transaction (see ``claim.jobs_claim``).
FlowSource = Callable[[str, str], FlowState]
