"""The read side of the operations console: everything the overview page shows.

The job table holds millions of finished rows, and an operator opens the
overview exactly when the system is under stress, so every query here is
bounded by an index and a cap, never by the size of the table:

* live jobs (pending, blocked, running) are counted through their partial
  indexes (``dispatch_job_claim``; ``dispatch_job_part_live``,
  ``dispatch_job_conc_next`` and ``dispatch_job_queue_next`` for blocked
  ones; ``dispatch_job_lease``), each stopping at ``LIVE_CAP`` rows (a
  backlog beyond that is shown as "more than");
* finished jobs are read only inside the recent window, through
  ``dispatch_job_finished`` (namespace, state, finished_at);
* wait and run time percentiles come from the newest ``TIMING_SAMPLE``
  finished jobs of that window;
* workers, leadership and cron entries are small tables.

A fixed number of queries per page (``tests/admin/test_admin_console.py`` counts
them and checks PostgreSQL's plans over 1,000,000 finished jobs). Nothing
here writes.

The page reads from ``DISPATCH["READ_DATABASE"]``'s replica when it is healthy
(``queries.reading``, chosen once per page so one page never mixes two
databases' moments), and says where it read and how far behind that is
(``Overview.reads``). The paused queues alone come from the primary: the
page's pause/resume buttons change them and redirect back to the page,
which must show the change made, not a replica's state from before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone

from ..conf import get_settings
from ..core.states import JobState
from ..models import CronEntry, DeadLetter, Job, Leadership, Worker
from ..store.base import LIVE_JOBS_BY_STATE, db_alias
from ..store.flow import queues_paused
from ..store.leadership import LEADER, lease_key
from ..tasks.registry import namespaces_with_databases
from .console_timings import add_timings, finished_by_minute
from .counting import probe
from .reading import ReadHealth, health

#: Live jobs of one state counted per page, at most (then "more than").
LIVE_CAP = 50_000
#: The "recent" window: finished counts and the throughput chart.
WINDOW = timedelta(hours=1)
#: Dead letters not yet replayed counted, at most.
DEAD_LETTER_CAP = 10_000
#: Cron entries listed, soonest first.
CRON_SHOWN = 8


@dataclass
class QueueRow:
    """One queue's line on the overview."""

    name: str
    pending: int = 0
    #: Due now, pending or scheduled and not staged yet: waiting for a worker
    #: (the rest are deferred).
    waiting: int = 0
    #: Blocked: marked so, or pending behind an earlier due job of their key.
    blocked: int = 0
    running: int = 0
    #: Deferred to later (an enqueue's ``run_after``, a retry's backoff).
    scheduled: int = 0
    succeeded: int = 0
    failed: int = 0
    #: ``run_after`` of the oldest job waiting for a worker.
    oldest_waiting: datetime | None = None
    #: Jobs finished per minute over the window, oldest minute first.
    per_minute: list[int] = field(default_factory=list)
    wait_p50: float | None = None
    wait_p95: float | None = None
    run_p50: float | None = None
    run_p95: float | None = None
    paused: bool = False
    #: Live workers that take jobs from this queue.
    served_by: int = 0
    #: A live count stopped at ``LIVE_CAP``.
    capped: bool = False

    @property
    def deferred(self) -> int:
        """Not due yet: scheduled (deferred or backing off), and the odd pending job
        written by a client whose clock runs ahead of the database's."""
        return self.scheduled + self.pending - self.waiting

    @property
    def unserved(self) -> bool:
        """Work is waiting and no live worker takes it: the operator must act."""
        return self.waiting + self.blocked > 0 and self.served_by == 0

    @property
    def throughput(self) -> float:
        """Jobs finished per minute, averaged over the window."""
        return sum(self.per_minute) / max(len(self.per_minute), 1)


@dataclass
class WorkerRow:
    worker: Worker
    live: bool
    leader: bool


@dataclass
class Overview:
    namespace: str
    namespaces: list[str]
    now: datetime
    window: timedelta
    queues: list[QueueRow]
    workers: list[WorkerRow]
    dead_letters: int
    dead_letters_capped: bool
    cron: list[CronEntry]
    #: Total finished per minute over the window (all queues): the chart.
    per_minute: list[tuple[datetime, int, int]]
    #: Show the paused column and its pause/resume controls.
    pause_supported: bool = False
    #: Where the page read (the replica or the primary) and why: lag, or a fallback.
    reads: ReadHealth | None = None

    @property
    def totals(self) -> QueueRow:
        total = QueueRow("all")
        for row in self.queues:
            for name in (
                "pending",
                "waiting",
                "scheduled",
                "blocked",
                "running",
                "succeeded",
                "failed",
            ):
                setattr(total, name, getattr(total, name) + getattr(row, name))
        return total


def _db(db: str | None) -> str:
    """The database a read uses: the page's choice, else the one operators' reads use now."""
    return db or health().used


def jobs(namespace: str, db: str | None = None) -> QuerySet[Job]:
    return Job.objects.using(_db(db)).filter(namespace=namespace)


def live_counts(namespace: str, state: str, now: datetime, db: str | None = None) -> list[Any]:
    """Per queue: jobs in ``state``, those due, the oldest due ``run_after``.

    Each walks the state's partial index and stops at ``LIVE_CAP`` rows.
    """
    db = _db(db)
    live = jobs(namespace, db).filter(LIVE_JOBS_BY_STATE[JobState(state)]).order_by()
    if connections[db].vendor == "postgresql":
        return live_counts_in_one_pass(live, now, db)
    return live_counts_joined(live, now, db)


def live_counts_joined(live: QuerySet[Job], now: datetime, db: str) -> list[Any]:
    """``live_counts`` through the ORM: the capped ids, then their rows grouped."""
    capped = live.values("pk")[: LIVE_CAP + 1]
    due = Q(run_after__lte=now)
    keyed_due = due & Q(partition_key__isnull=False)
    return list(
        Job.objects.using(db)
        .filter(pk__in=capped)
        .order_by()
        .values("queue_name")
        .annotate(
            n=Count("pk"),
            due=Count("pk", filter=due),
            oldest=Min("run_after", filter=due),
            # Due keyed jobs, and their distinct keys: all but one job per
            # key wait behind another (blocked, whether or not a worker has
            # marked them so yet).
            keyed_due=Count("pk", filter=keyed_due),
            keys_due=Count("partition_key", filter=keyed_due, distinct=True),
        )
    )


def live_counts_in_one_pass(live: QuerySet[Job], now: datetime, db: str) -> list[Any]:
    """``live_counts`` on PostgreSQL: grouped as the capped rows are read.

    The ORM groups only a whole table, so its statement joins the capped ids
    back to their rows (``pk IN``): a second index descent per live job, half
    the statement's time beside a backlog. Here the inner query reads the
    columns the counts need along with its index range, and stops at
    ``LIVE_CAP`` rows as well.
    """
    capped = live.values("queue_name", "run_after", "partition_key")[: LIVE_CAP + 1]
    sql, params = capped.query.get_compiler(using=db).as_sql()
    due = "s.run_after <= %s"
    keyed = f"{due} AND s.partition_key IS NOT NULL"
    with connections[db].cursor() as cursor:
        cursor.execute(
            f"SELECT s.queue_name, COUNT(*), COUNT(*) FILTER (WHERE {due}), "
            f"MIN(s.run_after) FILTER (WHERE {due}), COUNT(*) FILTER (WHERE {keyed}), "
            f"COUNT(DISTINCT s.partition_key) FILTER (WHERE {keyed}) "
            f"FROM ({sql}) s GROUP BY s.queue_name",
            (now, now, now, now, *params),
        )
        names = ("queue_name", "n", "due", "oldest", "keyed_due", "keys_due")
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def paused_queues(namespace: str) -> set[str]:
    """The namespace's paused queues, read on the primary (see the module docstring)."""
    return set(queues_paused(db_alias(), namespace=namespace))


def serves(worker: Worker, queue: str) -> bool:
    return not worker.queues or queue in worker.queues


class QueueRows(dict[str, QueueRow]):
    """The overview's queue rows by name; a queue gets its row when first seen."""

    def __missing__(self, name: str) -> QueueRow:
        row = self[name] = QueueRow(name)
        return row


def add_live_counts(rows: QueueRows, namespace: str, now: datetime, db: str | None = None) -> None:
    """Pending, blocked, running and scheduled per queue, one capped count per state."""
    for state in LIVE_JOBS_BY_STATE:  # each count walks its partial indexes
        found = live_counts(namespace, state, now, db)
        if sum(r["n"] for r in found) > LIVE_CAP:
            for r in found:
                rows[r["queue_name"]].capped = True
        for r in found:
            queue = rows[r["queue_name"]]
            setattr(queue, state, getattr(queue, state) + r["n"])
            if state == JobState.PENDING:
                # Due keyed jobs beyond one per key wait behind another: blocked.
                behind = r["keyed_due"] - r["keys_due"]
                queue.waiting += r["due"] - behind
                queue.pending -= behind
                queue.blocked += behind
            elif state == JobState.SCHEDULED:
                # Due and not staged yet: waiting too. Staging runs in the
                # workers' claims, so with none up it stays scheduled.
                queue.waiting += r["due"]
            else:
                continue
            if r["oldest"] is not None:
                oldest = queue.oldest_waiting
                queue.oldest_waiting = r["oldest"] if oldest is None else min(oldest, r["oldest"])


def window_minutes(since: datetime) -> list[datetime]:
    """The window's whole minutes after ``since``, oldest first: the chart's bars."""
    return [(since + timedelta(minutes=i)).replace(second=0, microsecond=0) for i in range(1, 61)]


def add_finished(
    rows: QueueRows,
    namespace: str,
    since: datetime,
    minutes: list[datetime],
    db: str | None = None,
) -> dict[datetime, list[int]]:
    """Finished counts per queue and per minute; returns the chart's [succeeded, failed]."""
    chart = {m: [0, 0] for m in minutes}
    bars = len(minutes)
    for queue_name, state, minute, n in finished_by_minute(namespace, since, _db(db)):
        queue = rows[queue_name]
        setattr(queue, state, getattr(queue, state) + n)
        if 1 <= minute <= bars:  # bar 0: the window's first, partial minute
            if not queue.per_minute:
                queue.per_minute = [0] * bars
            queue.per_minute[minute - 1] += n
            chart[minutes[minute - 1]][state == JobState.FAILED] += n
    return chart


def worker_rows(namespace: str, now: datetime, db: str | None = None) -> list[WorkerRow]:
    """The namespace's workers, each marked live (seen lately) and leader or not."""
    settings = get_settings()
    db = _db(db)
    fresh = now - timedelta(seconds=max(settings.LEASE_SECONDS, settings.HEARTBEAT_INTERVAL * 3))
    leader = (
        Leadership.objects.using(db)
        .filter(name=lease_key(LEADER, namespace), expires_at__gt=now)
        .values_list("holder", flat=True)
        .first()
    )
    return [
        WorkerRow(w, live=w.last_seen_at >= fresh, leader=w.pk == leader)
        for w in Worker.objects.using(db).filter(namespace=namespace).order_by("hostname", "pid")
    ]


def dead_letters_unreplayed(namespace: str, db: str | None = None) -> int:
    """Dead letters not replayed yet, counted up to one past ``DEAD_LETTER_CAP``."""
    rows = DeadLetter.objects.using(_db(db)).filter(namespace=namespace, replayed_at__isnull=True)
    return probe(rows, DEAD_LETTER_CAP)[0]


def next_cron(namespace: str, db: str | None = None) -> list[CronEntry]:
    """The enabled cron entries due soonest."""
    return list(
        CronEntry.objects.using(_db(db))
        .filter(namespace=namespace, enabled=True, next_run_at__isnull=False)
        .order_by("next_run_at")[:CRON_SHOWN]
    )


def known_namespaces(namespace: str, db: str | None = None) -> list[str]:
    """Namespaces with workers, the one shown, and those of the aliases with a
    database of their own (their workers register there): the page's
    namespace switch, which the admin routes to each namespace's database."""
    served = Worker.objects.using(_db(db)).order_by().values_list("namespace", flat=True)
    return sorted(set(served.distinct()) | {namespace} | namespaces_with_databases())


def overview(namespace: str = "") -> Overview:
    """Everything the overview page shows, for one namespace."""
    reads = health()
    db = reads.used
    now = timezone.now()
    since = now - WINDOW
    rows = QueueRows()
    add_live_counts(rows, namespace, now, db)
    minutes = window_minutes(since)
    chart = add_finished(rows, namespace, since, minutes, db)
    add_timings(rows, namespace, since, db)
    workers = worker_rows(namespace, now, db)
    for queue in rows.values():
        queue.served_by = sum(1 for w in workers if w.live and serves(w.worker, queue.name))
    for name in paused_queues(namespace):
        rows[name].paused = True
    letters = dead_letters_unreplayed(namespace, db)
    cron = next_cron(namespace, db)
    return Overview(
        namespace=namespace,
        namespaces=known_namespaces(namespace, db),
        now=now,
        window=WINDOW,
        queues=sorted(rows.values(), key=lambda q: (not q.unserved, q.name)),
        workers=workers,
        dead_letters=min(letters, DEAD_LETTER_CAP),
        dead_letters_capped=letters > DEAD_LETTER_CAP,
        cron=cron,
        per_minute=[(m, *chart[m]) for m in minutes],  # type: ignore[misc]
        pause_supported=True,
        reads=reads,
    )
