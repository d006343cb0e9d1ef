"""A snapshot of the queue for operators: workers, leader, depths, ages, cron.

Every query is bounded: counts are per state over the partial indexes of
live jobs, never a COUNT(*) over finished ones; dead letters not replayed
are counted exactly up to ``COUNT_EXACT_MAX``, then estimated.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Min
from django.db.models.functions import Now

from .. import store
from ..core.states import JobState
from ..models import CronEntry, DeadLetter, Job, Worker
from ..store.base import LIVE_JOBS_BY_STATE, live_jobs
from ..store.flow import queues_paused
from .counting import bounded_count


@dataclass
class QueueStatus:
    name: str
    pending: int = 0
    blocked: int = 0
    running: int = 0
    scheduled: int = 0  # deferred to later: not waiting for a worker yet
    #: Age of the oldest job due and not started (pending, or scheduled and
    #: not staged yet), whether or not a worker is there to take it.
    oldest_due: timedelta | None = None
    paused: bool = False  # flow.pause_queue: no job of it starts


@dataclass
class Status:
    now: datetime
    workers: list[Worker]
    leader: tuple[str, bool] | None
    queues: list[QueueStatus]
    dead_letters_unreplayed: int
    cron: list[CronEntry]


def snapshot(namespace: str = "") -> Status:
    """The snapshot of one namespace (``dispatch_status --backend``)."""
    db = store.db_alias()
    jobs = Job.objects.using(db).filter(namespace=namespace)
    now = store.db_now(db)
    queues: dict[str, QueueStatus] = {}
    for row in jobs.filter(live_jobs()).values("queue_name", "state").annotate(n=Count("id")):
        queue = queues.setdefault(row["queue_name"], QueueStatus(row["queue_name"]))
        setattr(queue, row["state"], row["n"])
    # Due and not started: pending, or scheduled and not staged yet (staging
    # runs in workers' claims, so with every worker down a due deferred job
    # or retry stays scheduled: it is waiting all the same). Each arm walks
    # its partial index (dispatch_job_scheduled: namespace, run_after).
    waiting = LIVE_JOBS_BY_STATE[JobState.PENDING] | LIVE_JOBS_BY_STATE[JobState.SCHEDULED]
    oldest_due = (
        jobs.filter(waiting, run_after__lte=Now())
        .values_list("queue_name")
        .annotate(oldest=Min("run_after"))
    )
    for name, oldest in oldest_due:
        queues.setdefault(name, QueueStatus(name)).oldest_due = now - oldest
    for name in queues_paused(db, namespace=namespace):
        queues.setdefault(name, QueueStatus(name)).paused = True
    return Status(
        now=now,
        workers=list(Worker.objects.using(db).filter(namespace=namespace).order_by("id")),
        leader=store.leadership_holder(db=db, namespace=namespace),
        queues=sorted(queues.values(), key=lambda q: q.name),
        # Exact up to COUNT_EXACT_MAX, then about: a COUNT(*) of a long
        # history of dead letters would read all of them.
        dead_letters_unreplayed=bounded_count(
            DeadLetter.objects.using(db).filter(namespace=namespace, replayed_at__isnull=True)
        ),
        cron=list(CronEntry.objects.using(db).filter(namespace=namespace).order_by("name")),
    )
