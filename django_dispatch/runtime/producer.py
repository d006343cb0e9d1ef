"""The producer: the control loop, the claim, and starting what it claimed.

The control loop (a worker's main thread) never runs task code. Each turn it
runs the periodic duties that are due (the heartbeat, maintenance), lets the
worker's lifecycle act (timeouts, stopping, recycling), then claims jobs up
to the free slots (``cycle``) and hands each to a job thread or the event
loop (``start``). The claim shares one transaction with the completer's
wave of successes (``BatchCompleter.write_wave``): the slots a wave frees
are refilled in the same commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

from django.db import DatabaseError, InterfaceError, connections

from .. import store
from ..conf import DispatchSettings
from ..store.flow import claimable_queues
from ..store.types import Placement
from ..store.wave import WaveClaim
from . import attempt, completer, flow_cache
from .asyncjobs import AsyncJobs
from .connections import database_went_away
from .jobthreads import JobThreads
from .options import Every, WorkerOptions
from .running import RunningJob
from .slots import COMPLETION_BATCH, PG_WAVE, PREFETCH_JOB_SECONDS, Slots

logger = logging.getLogger("django_dispatch.worker")


class Lifecycle(Protocol):
    """What the loop asks of the worker that runs it (``worker.Worker``)."""

    #: No new claims: the worker is stopping, draining or recycling.
    stopping: bool

    def turn(self, now: float) -> bool:
        """The lifecycle's share of one turn; True: the loop ends."""
        ...

    def drain(self) -> None:
        """Nothing more to claim (``--burst``, ``--max-jobs``): finish what runs."""
        ...


def guarded[T](step: Callable[[], T], pause: float) -> T | None:
    """Run one control-loop step; a database outage or a bug is logged, never fatal."""
    try:
        return step()
    except (DatabaseError, InterfaceError):
        logger.warning("database error in the worker loop; will retry", exc_info=True)
        database_went_away()  # job threads check their connections before their next job
        for conn in connections.all(initialized_only=True):
            conn.close()
        time.sleep(pause)
    except Exception:
        logger.exception("error in the worker loop; carrying on")
    return None


class Producer:
    """Claims jobs up to the free slots and starts them, turn after turn."""

    def __init__(
        self,
        options: WorkerOptions,
        settings: DispatchSettings,
        *,
        db: str,
        slots: Slots,
        batch: completer.BatchCompleter,
    ) -> None:
        self.options = options
        self.settings = settings
        self.db = db
        self.slots = slots
        self.completer = batch
        self.wakeup = batch.wakeup
        #: Jobs claimed (and not given back) so far, for ``--max-jobs``; a
        #: recycled process goes on from its predecessor's count.
        self.claimed_total = options.predecessor.claimed if options.predecessor else 0
        #: Where claimed jobs run: set by ``Worker.run`` before the first claim.
        self.pool: JobThreads | None = None
        self.async_jobs: AsyncJobs | None = None
        #: Whether a wave may be one statement (``fused_claim``): PostgreSQL.
        self.one_statement = connections[db].vendor == "postgresql"
        #: Until then (monotonic), waves claim through the gates: keyed jobs were seen.
        self.gated_until = 0.0

    def guard[T](self, step: Callable[[], T]) -> T | None:
        return guarded(step, min(1.0, self.settings.POLL_INTERVAL))

    def run(self, duties: list[Every], life: Lifecycle) -> None:
        """The control loop, until the worker's lifecycle ends it."""
        while True:
            now = time.monotonic()
            for duty in duties:
                if duty.due(now):
                    self.guard(duty.run)
            if life.turn(now):
                return
            if not life.stopping and self.produce(life):
                continue  # more may be waiting: claim again at once
            self.wait(duties)

    def produce(self, life: Lifecycle) -> bool:
        """One turn's claim; True: go round again at once, without waiting."""
        self.give_back(
            self.slots.behind_long_jobs(), why="claimed ahead, behind a job that ran long"
        )
        claimed = self.guard(self.cycle) or 0
        if self.done(claimed):
            life.drain()
            return True
        # Successes queued for the next wave hold their slots until it takes
        # them (``Slots.free``), but that wave is due at once all the same: then
        # the slots need no count (a walk over every job held, hundreds with
        # an asyncio executor).
        return bool(claimed and (not self.completer.waiting.empty() or self.slots.free()))

    def wait(self, duties: list[Every]) -> None:
        """Sleep until woken (a job ended, a notification) or the next duty is due."""
        next_duty = min(duty.next_at for duty in duties)
        wait = min(self.settings.POLL_INTERVAL, max(0.0, next_duty - time.monotonic()))
        if self.slots.holding_ahead:  # soon see whether they wait behind a long job
            wait = min(wait, PREFETCH_JOB_SECONDS)
        self.wakeup.wait(wait)
        self.wakeup.clear()
        self.completer.coalesce(len(self.slots.running))

    def cycle(self, claim: bool = True) -> int:
        """One round trip's worth of work: record finished jobs, claim new ones.

        Successes waiting in the completer are written and the slots they
        free refilled by the claim in one transaction (``write_wave``): a
        single commit (one WAL flush) per wave of jobs. The job threads did
        not wait for it: they went on to jobs claimed ahead (``Slots.ahead``),
        so the wave carries whatever finished while the last one was written.
        Returns the number of jobs claimed.
        """
        batch = self.take_wave()
        limit = self.slots.free() if claim else 0
        if self.options.max_jobs is not None:
            limit = min(limit, self.options.max_jobs - self.claimed_total)
        if not batch and limit <= 0:
            return 0
        claimed = self.completer.write_wave(batch, self.claim, limit, self.fused_claim)
        if limit > 0:
            self.slots.backlog = len(claimed) >= limit
        if self.completer.passed:  # concurrency groups are about: the gates claim for a while
            self.gated_until = time.monotonic() + self.settings.POLL_INTERVAL
        if claimed:
            self.start(claimed)
        return len(claimed)

    def take_wave(self) -> list[RunningJob]:
        """The successes the next wave writes: on PostgreSQL up to ``PG_WAVE``,
        in ``COMPLETION_BATCH`` takes; elsewhere one take."""
        batch = self.completer.take()
        while self.one_statement and COMPLETION_BATCH <= len(batch) < PG_WAVE:
            more = self.completer.take()
            batch += more
            if len(more) < COMPLETION_BATCH:
                break
        return batch

    def flush(self) -> None:
        """At the worker's end: write every success still waiting, a wave at a time.

        One last wave writes at most ``COMPLETION_BATCH``; a stop that reached
        its deadline with more waiting (hundreds of async slots finishing at
        once) would leave the rest unwritten and leased, to run again after
        their lease. If a wave fails, the rest write their own outcomes
        (``abort``: each job through the reporter, retried up to a lease)."""
        while not self.completer.waiting.empty():
            if self.guard(lambda: self.cycle(claim=False)) is None:
                while batch := self.completer.take():
                    self.completer.abort(batch)
                return

    def fused_claim(self, limit: int) -> WaveClaim | None:
        """The wave's claim as one statement with its successes (``store.wave``),
        or None where it needs ``claim``'s transaction: SQLite, a worker with a
        placement, queue limits, a concurrency group waiting, every served
        queue paused, or a concurrency group's jobs passed by lately. Staging,
        when due, runs first in a statement of its own: the wave's claim sees
        what it staged, and a busy worker's every wave stays one statement."""
        if not self.one_statement or time.monotonic() < self.gated_until:
            return None
        opts, max_age = self.options, self.settings.POLL_INTERVAL
        if limit <= 0:
            return WaveClaim(opts.worker_id, 0, self.settings.LEASE_SECONDS, opts.namespace)
        if self.placement() is not None:
            return None
        flow_cache.stage_if_due(self.db, opts.namespace, max_age)
        state = flow_cache.flow_for_claim(self.db, opts.namespace, max_age)
        if state.waiting or state.limits:
            return None
        served, paused = claimable_queues(opts.queues, state.paused)
        if state.paused and not served and not paused:
            return None
        return WaveClaim(
            opts.worker_id, limit, self.settings.LEASE_SECONDS, opts.namespace, served, paused
        )

    def claim(self, limit: int) -> list[store.ClaimedJob]:
        """Up to ``limit`` jobs, leased to this worker (inside the wave's transaction)."""
        return flow_cache.jobs_claim(
            worker_id=self.options.worker_id,
            queues=self.options.queues,
            limit=limit,
            lease_seconds=self.settings.LEASE_SECONDS,
            db=self.db,
            namespace=self.options.namespace,
            max_age=self.settings.POLL_INTERVAL,  # how stale a pause may be seen
            placement=self.placement(),
        )

    def placement(self) -> Placement | None:
        opts = self.options
        starve = self.settings.RESOURCE_STARVATION_SECONDS
        return self.slots.placement(opts.capacity, opts.locality, starve)

    def start(self, claimed: list[store.ClaimedJob]) -> None:
        """Hand each claimed job to a job thread, or, with an asyncio executor,
        an async job to its event loop (resolving the task here: its module is
        imported once, then it is a lookup)."""
        async_jobs, pool = self.async_jobs, self.pool
        assert pool is not None
        lease_seconds = self.settings.LEASE_SECONDS
        runs = [RunningJob(claimed=job, lease_seconds=lease_seconds) for job in claimed]
        on_loop: list[RunningJob] = []
        if async_jobs is not None:
            attempt.resolve_claim(runs)
            for running in runs:
                running.on_loop = attempt.is_async(running)
                if running.on_loop:
                    on_loop.append(running)
        # Every job is in the slots before any thread can start (and end) it.
        with self.slots.lock:
            self.slots.running.update((running.claimed.id, running) for running in runs)
        for running in runs:
            if not running.on_loop:
                pool.submit(running)
        if async_jobs is not None:
            if on_loop:
                async_jobs.submit(on_loop)
            self.slots.learn(len(on_loop), len(claimed))
        self.claimed_total += len(claimed)

    def done(self, claimed: int) -> bool:
        """Whether there is nothing more to claim: ``--max-jobs`` reached, or
        ``--burst`` with nothing running and nothing due."""
        opts = self.options
        if opts.max_jobs is not None and self.claimed_total >= opts.max_jobs:
            return True
        if not (opts.burst and claimed == 0 and not self.slots.running):
            return False
        # An empty claim is not an empty queue: jobs may wait behind a
        # partition head that another worker is running.
        due = self.guard(self._due_exist)
        return due is False  # None: the database did not answer; keep going

    def _due_exist(self) -> bool:
        opts = self.options
        return store.jobs_due_exist(
            queues=opts.queues, db=self.db, namespace=opts.namespace, placement=self.placement()
        )

    def give_back(self, unstarted: list[RunningJob], why: str) -> None:
        """Hand back jobs no thread started, taken out of the slots: fenced by
        their leases, no attempt spent, reported with ``why``. They no longer
        count as claimed here (``--max-jobs``, ``testing.drain``'s count): this
        worker did not run them."""
        self.claimed_total -= len(unstarted)
        for running in unstarted:
            self.guard(partial(completer.release, running.claimed, why=why))
