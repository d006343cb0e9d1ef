"""Durable waits of workflow steps: record a wait, wake it on a publish or at its time.

A step that calls ``ctx.wait_for_event`` / ``ctx.sleep`` for a result it has
not got yet stops, and its attempt is recorded here as ``running ->
waiting`` (fenced by its claim): no thread, job or connection is held while
it waits, only the step row (and, for a wait with an end, one deferred job).
When the wait ends the step gets a new job and runs again; its n-th wait
call then returns the n-th entry of ``waits`` (see docs/workflows.md).

A wait ends in one of three ways, each a compare-and-set on ``state =
'waiting'`` so exactly one of them wins:

* a publish of a matching event (``wake_waiting_steps``, a publish hook run
  in the publisher's transaction): every waiting step of every run gets its
  own copy;
* the step's timer job, run at ``wait_until`` (``claim_timed_out`` in
  ``steps.workflow_step_claim``): the wait timed out, or the sleep is over;
* already when it is recorded: a matching event was published since the run
  began (the look-back), or the sleep's end has passed.

The look-back and the publish are serialized by the event-name lock (see
``store.events``), so no publish can slip between them: no lost wake-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.db.models.functions import Now

from ...core.states import QUEUED_STATES, JobState
from ...core.workflow_states import StepState
from ...models import Event, Job, WorkflowRun, WorkflowTask
from ..base import db_now, now_plus
from ..enqueue import jobs_insert
from ..events import lock_event_name
from ..sql import JSONAppend
from .common import (
    RunRow,
    StepJobBuilder,
    claim_fence,
    db_or_default,
    enqueue_steps,
    locked_run,
)
from .stepjobs import routes_of, step_job

#: The wait fields cleared when a wait ends.
NO_WAIT: dict[str, Any] = {"wait_event_name": None, "wait_event_key": None, "wait_until": None}


@dataclass(frozen=True, slots=True)
class WaitSpec:
    """One wait a step asked for: an event (``name``, ``key``) or a time.

    ``seconds`` (from now, database clock) or ``until`` (absolute) bound it;
    neither: an event wait with no timeout.
    """

    kind: str  # "event" | "sleep"
    name: str | None = None
    key: str | None = None
    seconds: float | None = None
    until: datetime | None = None


def event_entry(event: Event | Mapping[str, Any]) -> dict[str, Any]:
    """How a delivered event is kept in ``waits``."""
    get = event.get if isinstance(event, Mapping) else lambda f: getattr(event, f)
    return {
        "kind": "event",
        "event_id": get("id") if isinstance(event, Mapping) else event.pk,
        "name": get("name"),
        "key": get("key"),
        "payload": get("payload"),
        "timed_out": False,
    }


def workflow_step_wait(
    step_id: int,
    claim_id: str,
    wait: WaitSpec,
    *,
    build_job: StepJobBuilder,
    db: str | None = None,
) -> bool:
    """running -> waiting (or straight back to ready); False when the claim was lost."""
    db = db_or_default(db)
    with locked_run(db, step_id=step_id) as run:
        if run is None:
            return False
        if wait.kind == "event":
            assert wait.name is not None
            lock_event_name(db, run["namespace"], wait.name, shared=False)
        fence = claim_fence(db, step_id, claim_id)
        step = fence.values("waits", "generation").first()
        if step is None:
            return False
        entry = _already_over(db, run, wait, step["waits"])
        # Every write below is fenced, its result checked first: a re-run of
        # this step's job (after a lease expiry) takes the step over with no
        # run lock, so the claim read above may be void by now. Then nothing
        # may be written: no job inserted, the re-run's claim left intact.
        if entry is not None:
            if not fence.update(claim_id=None, waits=JSONAppend("waits", entry), updated_at=Now()):
                return False
            enqueue_steps(db, run, [(step_id, step["generation"])], build_job)
            return True
        until: Any = None
        if wait.seconds is not None:
            until = now_plus(wait.seconds)
        elif wait.until is not None:
            until = wait.until
        if not fence.update(
            state=StepState.WAITING,
            claim_id=None,
            job_id=None,
            wait_event_name=wait.name if wait.kind == "event" else None,
            wait_event_key=wait.key if wait.kind == "event" else None,
            wait_until=until,
            heartbeat_at=Now(),
            updated_at=Now(),
        ):
            return False
        if until is not None:  # the step row is ours (locked by the update) until commit
            timer_id = _insert_timer(db, run, step_id, step["generation"], until, build_job)
            WorkflowTask.objects.using(db).filter(id=step_id).update(job_id=timer_id)
    return True


def _already_over(
    db: str, run: RunRow, wait: WaitSpec, done: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The wait's result if it needs no waiting: a sleep whose end has passed, or an
    event published since the run began that this step has not received yet."""
    if wait.kind == "sleep":
        over = (wait.seconds is not None and wait.seconds <= 0) or (
            wait.until is not None and wait.until <= db_now(db)
        )
        return {"kind": "sleep", "timed_out": False} if over else None
    started = WorkflowRun.objects.using(db).values_list("created_at", flat=True).get(id=run["id"])
    received = [w["event_id"] for w in done if w.get("event_id")]
    events = Event.objects.using(db).filter(
        namespace=run["namespace"], name=wait.name, published_at__gte=started
    )
    if wait.key is not None:
        events = events.filter(key=wait.key)
    found = (
        events.exclude(id__in=received)
        .order_by("id")
        .values("id", "name", "key", "payload")
        .first()
    )
    return event_entry(found) if found else None


def _insert_timer(
    db: str, run: RunRow, step_id: int, generation: int, until: Any, build_job: StepJobBuilder
) -> int:
    """The deferred job that ends the wait at ``until`` (database clock)."""
    job = step_job(build_job, run, step_id, generation, routes_of(db, [step_id])[step_id])
    job.run_after = until
    job.state = JobState.SCHEDULED  # kept for an SQL ``until``; a datetime decides itself
    jobs_insert([job], db=db)
    return job.pk


def rearm_timer(
    step_id: int, job_id: int, *, build_job: StepJobBuilder, db: str | None = None
) -> bool:
    """A timer job ran before its step's ``wait_until`` (made due early by hand):
    give the step a fresh timer job at ``wait_until``, so the wait keeps its end."""
    db = db_or_default(db)
    with locked_run(db, step_id=step_id) as run:
        if run is None:
            return False
        return rearm(db, run, step_id, job_id, build_job)


def rearm(
    db: str, run: RunRow, step_id: int, job_id: int | None, build_job: StepJobBuilder
) -> bool:
    """A fresh timer job at the step's ``wait_until``, if it still waits on timer ``job_id``.

    Called with the run locked. The step row is locked before the timer is
    inserted: a claim by the old timer job (which takes no run lock) either
    committed first (the step is no longer waiting on it: nothing to do) or
    waits for this commit and then no longer matches its fence. So a wait
    never ends up with two timers, nor a timer for a step that is not waiting.
    """
    waiting = WorkflowTask.objects.using(db).filter(
        id=step_id, state=StepState.WAITING, job_id=job_id, wait_until__isnull=False
    )
    row = waiting.select_for_update(of=("self",)).values("generation", "wait_until").first()
    if row is None:
        return False
    timer = _insert_timer(db, run, step_id, row["generation"], row["wait_until"], build_job)
    return waiting.update(job_id=timer) == 1


def wake_waiting_steps(db: str, event: Event, build_job: StepJobBuilder) -> int:
    """waiting -> ready, with the event appended to ``waits``, for every step waiting on it.

    Called in the publisher's transaction, under the shared event-name lock.
    A step waiting with a key matches that key only; one waiting with no key
    matches every event of the name. Rows are locked in id order (no
    deadlock between two publishes); the run rows are not locked, since a
    wake, like a claim, changes this step only. Returns how many woke.
    """
    waiting = WorkflowTask.objects.using(db).filter(
        namespace=event.namespace, state=StepState.WAITING, wait_event_name=event.name
    )
    if event.key is None:
        waiting = waiting.filter(wait_event_key__isnull=True)
    else:
        waiting = waiting.filter(Q(wait_event_key__isnull=True) | Q(wait_event_key=event.key))
    rows = list(
        waiting.order_by("id")
        .select_for_update(of=("self",))
        .values("id", "generation", "run_id", "job_id", "queue_name", "priority")
    )
    if not rows:
        return 0
    queues = dict(
        WorkflowRun.objects.using(db)
        .filter(id__in={r["run_id"] for r in rows})
        .values_list("id", "queue_name")
    )
    jobs = [
        step_job(
            build_job,
            {"queue_name": queues[r["run_id"]], "namespace": event.namespace},
            r["id"],
            r["generation"],
            (r["queue_name"], r["priority"]),
        )
        for r in rows
    ]
    jobs_insert(jobs, db=db)
    entry = event_entry(event)
    for row, job in zip(rows, jobs, strict=True):
        WorkflowTask.objects.using(db).filter(id=row["id"], state=StepState.WAITING).update(
            state=StepState.READY,
            job_id=job.pk,
            claim_id=None,
            waits=JSONAppend("waits", entry),
            ready_at=Now(),
            heartbeat_at=Now(),
            updated_at=Now(),
            **NO_WAIT,
        )
    timers = [r["job_id"] for r in rows if r["job_id"]]
    if timers:  # their wait is over: they would only find the step gone
        Job.objects.using(db).filter(id__in=timers, state__in=QUEUED_STATES).update(
            state=JobState.CANCELLED, finished_at=Now()
        )
    return len(rows)


def timed_out_entry(wait_event_name: str | None) -> dict[str, Any]:
    """How a wait ended by its timer is kept in ``waits``."""
    if wait_event_name is None:
        return {"kind": "sleep", "timed_out": False}
    return {"kind": "event", "name": wait_event_name, "timed_out": True}
