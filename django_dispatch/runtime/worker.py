"""One worker process: the control loop (the producer) beside a pool of job threads.

The control loop (the main thread) never runs task code. It claims jobs up to
the free slots, renews the leases of running jobs on a fixed heartbeat,
returns expired leases of dead workers to the queue, enforces timeouts, and
drives graceful shutdown. Because task code runs only on job threads, a
CPU-bound or blocking task cannot stop the heartbeat that keeps its lease.

The roles, a module each: the job threads (``jobthreads``) run jobs, the
executor classifies an attempt's outcome without I/O (``executor``), the
completer persists outcomes, successes in waves written inside the claim's
transaction (``completer``), the overseer finds jobs over their timeout
(``timeouts``), and a job that does not stop within the grace period is
ended by recycling the process (``recycling``).

Database connections: one per job thread, one for the control loop, and on
PostgreSQL with LISTEN on, one for the listener: ``concurrency + 2`` (``+ 1``
without LISTEN); a thread given up on in-process keeps its own until it returns.
An asyncio executor (``--async-concurrency``, ``asyncjobs``) adds one, however
many async jobs it runs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from types import FrameType
from typing import Any

from django.db import DatabaseError, InterfaceError, connections, transaction

from .. import store
from ..conf import DispatchSettings, get_settings
from ..observability import events, metrics
from . import completer, executor, recycling, scheduler, timeouts
from .asyncjobs import AsyncJobs
from .connections import database_went_away
from .jobthreads import PREFETCH_JOB_SECONDS, JobRunner, JobThreads, Slots
from .listener import Listener, start_listener
from .maintenance import Maintenance
from .options import Every, WorkerOptions

logger = logging.getLogger("django_dispatch.worker")

#: A second stop signal within this many seconds is the same request.
SIGNAL_DEDUP_SECONDS = 1.0
#: How often a ``--processes`` child checks that its supervisor is alive.
SUPERVISOR_CHECK_SECONDS = 1.0


class Worker:
    def __init__(
        self,
        options: WorkerOptions,
        settings: DispatchSettings | None = None,
        *,
        close_connections: bool = True,
    ) -> None:
        self.options = options
        self.close_connections = close_connections
        self.settings = settings or get_settings()
        self.db = store.db_alias()
        self.wakeup = threading.Event()
        self.stopping = False
        self.force_stop = False
        # Claiming ahead only on PostgreSQL: SQLite has one writer, so a claim
        # round trip saves little there, while jobs waiting for its write lock
        # often pass the short mark and would be given back and claimed again.
        postgres = connections[self.db].vendor == "postgresql"
        self.slots = Slots(
            options.concurrency,
            options.async_concurrency,
            prefetch=options.concurrency if postgres else 0,
        )
        #: What the worker row says about this process (see ``store.workers``).
        self.registration: dict[str, Any] = {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "queues": options.queues,
            "concurrency": options.concurrency + options.async_concurrency,
            "db": self.db,
            "namespace": options.namespace,
            "capacity": options.capacity,  # #16
            "locality": options.locality,
        }
        self.claimed_total = 0
        self.completer = completer.BatchCompleter(self.wakeup, self.settings.LEASE_SECONDS)
        self.listener: Listener | None = None
        self.async_jobs: AsyncJobs | None = None  # --async-concurrency: made in run()
        self.signalled_at: float | None = None
        #: When running jobs are handed back. None while draining after
        #: --burst or --max-jobs: those jobs run to completion.
        self.stop_deadline: float | None = None
        self.handed_back = False
        self.overseer = timeouts.Overseer(self.slots.lock, self.settings.TIMEOUT_GRACE)
        #: Set once a job ignored its stop request past the grace period: the
        #: loop ends and ``handover`` lists the jobs for the successor process.
        self.recycling = False
        self.recycle_deadline = 0.0  # monotonic; see _ready_to_recycle
        self.handover: recycling.Handover | None = None
        if options.predecessor is not None:
            self.claimed_total = options.predecessor.claimed

    def cycle(self, claim: bool = True) -> int:
        """One round trip's worth of work: record finished jobs, claim new ones.

        Successes waiting in the batch completer are written by one fenced UPDATE
        and the slots they free are refilled by the claim, in one transaction:
        a single commit (one WAL flush) per wave of jobs. The job threads did
        not wait for it: they went on to jobs claimed ahead (``Slots.ahead``),
        so the wave carries whatever finished while the last one was written.
        After the commit the reporter (``completer.Reporter``) sends each
        success's ``task_finished``; if the commit failed, it writes each
        outcome one by one. Returns the number of jobs claimed.
        """
        batch = self.completer.take()
        limit = self.slots.free() if claim else 0
        if self.options.max_jobs is not None:
            limit = min(limit, self.options.max_jobs - self.claimed_total)
        if not batch and limit <= 0:
            return 0
        try:
            with transaction.atomic(using=self.db):
                won = self.completer.write(batch, self.db)
                claimed = self._claim(limit) if limit > 0 else []
        except BaseException:
            self.completer.abort(batch)
            raise
        with self.slots.lock:
            for running in batch:
                if self.slots.running.get(running.claimed.id) is running:
                    del self.slots.running[running.claimed.id]
        self.completer.settle(batch, won)
        self._start(claimed)
        return len(claimed)

    # --- control loop --------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signalled_at is not None and now - self.signalled_at < SIGNAL_DEDUP_SECONDS:
            # The same stop request twice: once to the process group (systemd,
            # Ctrl-C) and once forwarded by the --processes supervisor.
            return
        first = self.signalled_at is None
        self.signalled_at = now
        if not first:
            logger.warning(
                "second %s: handing back running jobs now",
                signal.Signals(signum).name,
                extra=self._fields(),
            )
            self.force_stop = True
            self.wakeup.set()
        else:
            self.request_stop(signal.Signals(signum).name)

    def _fields(self, **more: object) -> dict[str, object]:
        return events.worker_fields(self.options.worker_id, **more)

    def request_stop(self, why: str) -> None:
        """Stop claiming; let running jobs finish within the shutdown timeout."""
        now = time.monotonic()
        if self.signalled_at is None:
            self.signalled_at = now
        logger.info(
            "%s: no new claims; waiting up to %s s for running jobs",
            why,
            self.options.shutdown_timeout,
            extra=self._fields(),
        )
        self.stopping = True
        self.slots.stopping = True  # the loop hands back the jobs claimed ahead
        self.stop_deadline = now + self.options.shutdown_timeout
        self.wakeup.set()

    def run(self) -> int:
        opts, cfg = self.options, self.settings
        reporter = completer.Reporter(give_up_after=cfg.LEASE_SECONDS)
        runner = JobRunner(
            self.slots,
            self.overseer,
            self.completer,
            lease_seconds=cfg.LEASE_SECONDS,
            db=self.db,
            wakeup=self.wakeup,
            reporter=reporter,
        )
        self.pool = pool = JobThreads(runner, opts.concurrency)
        self.async_jobs = AsyncJobs(runner) if opts.async_concurrency else None
        maintenance = Maintenance(opts.worker_id, cfg, self.db, opts.namespace)
        try:
            store.worker_register(opts.worker_id, **self.registration)
            events.worker_started(opts.worker_id, opts.queues, opts.concurrency)
            self.listener = start_listener(
                self.db, self.settings, self.wakeup, namespace=opts.namespace
            )
            if opts.predecessor is not None:
                recycling.settle(
                    opts.predecessor,
                    lease_seconds=cfg.LEASE_SECONDS,
                    db=self.db,
                    namespace=opts.namespace,
                )
            if opts.scheduler:
                self._guard(lambda: scheduler.sync_from_settings(namespace=opts.namespace))
            self._loop(maintenance)
            if self.recycling:
                self.handover = self._handover()
        finally:
            self._guard(lambda: self.cycle(claim=False))
            reporter.stop()  # after the last wave: its successes are reported
            # Threads still in task code after a hand-back are not waited for:
            # their jobs are back in the queue, and exiting ends them. Nor
            # after a recycle: the successor settles their jobs once
            # re-executing the process has ended them.
            pool.stop(timeout=0.0 if self.handed_back or self.recycling else 5.0)
            if self.async_jobs is not None:
                self.async_jobs.stop(timeout=0.0 if self.handed_back or self.recycling else 5.0)
            if self.listener:
                self.listener.stop()
                self.listener.join(timeout=2.0)
            self._guard(maintenance.resign)
            self._guard(lambda: store.worker_deregister(opts.worker_id))
            if self.close_connections:
                connections.close_all()
        events.worker_stopped(
            opts.worker_id, self.claimed_total, recycling=self.handover is not None
        )
        return 0

    def _loop(self, maintenance: Maintenance) -> None:
        opts, cfg = self.options, self.settings
        duties = [
            Every(cfg.HEARTBEAT_INTERVAL, self.heartbeat, start_now=False),
            *maintenance.duties(cron=opts.scheduler),
        ]
        if opts.supervisor_pid is not None:
            duties.append(Every(SUPERVISOR_CHECK_SECONDS, self._watch_supervisor))
        while True:
            now = time.monotonic()
            for duty in duties:
                if duty.due(now):
                    self._guard(duty.run)
            shutting_down = self.signalled_at is not None
            verdict = self.overseer.check(now, self.slots.running, opts.recycle, shutting_down)
            timeouts.act(verdict, self.recycling, give_up=self.give_up, recycle=self.recycle)
            if self.recycling and self._ready_to_recycle(now):
                break

            if self.stopping:
                if self.slots.stopping and not self.recycling:
                    self._guard(self.release_unstarted)
                self._guard(lambda: self.cycle(claim=False))
                if not self.slots.running:
                    break
                deadline = self.stop_deadline
                if self.force_stop or (deadline is not None and now >= deadline):
                    self.hand_back()
                    break
            else:
                self._give_back(self.slots.behind_long_jobs())
                claimed = self._guard(self.cycle) or 0
                if self._done(claimed):
                    self.stopping = True
                    continue
                if claimed and self.slots.free():
                    continue  # more may be waiting: claim again at once
            next_duty = min(duty.next_at for duty in duties)
            wait = min(cfg.POLL_INTERVAL, max(0.0, next_duty - time.monotonic()))
            if self.slots.holding_ahead:  # soon see whether they wait behind a long job
                wait = min(wait, PREFETCH_JOB_SECONDS)
            self.wakeup.wait(wait)
            self.wakeup.clear()
            self.completer.coalesce(len(self.slots.running))

    def _watch_supervisor(self) -> None:
        """Stop as on SIGTERM once the ``--processes`` supervisor is gone.

        A supervisor killed outright (SIGKILL, the OOM killer) forwards no
        signal: its children would live on as orphans, claiming jobs beside
        the workers a restart starts, out of reach of the next stop or
        deploy. The kernel re-parents an orphan, so the parent's PID changes.
        """
        supervisor = self.options.supervisor_pid
        if self.stopping or supervisor is None or os.getppid() == supervisor:
            return
        logger.warning(
            "the --processes supervisor (pid %s) is gone; stopping this child",
            supervisor,
            extra=self._fields(),
        )
        self.request_stop("the supervisor is gone")

    def _done(self, claimed: int) -> bool:
        opts = self.options
        if opts.max_jobs is not None and self.claimed_total >= opts.max_jobs:
            return True
        if not (opts.burst and claimed == 0 and not self.slots.running):
            return False
        # An empty claim is not an empty queue: jobs may wait behind a
        # partition head that another worker is running.
        due = self._guard(
            lambda: store.jobs_due_exist(
                queues=opts.queues,
                db=self.db,
                namespace=opts.namespace,
                placement=self._placement(),
            )
        )
        return due is False  # None: the database did not answer; keep going

    def _guard(self, step):
        """Run one control-loop step; a database outage or a bug is logged, never fatal."""
        try:
            return step()
        except (DatabaseError, InterfaceError):
            logger.warning("database error in the worker loop; will retry", exc_info=True)
            database_went_away()  # job threads check their connections before their next job
            for conn in connections.all(initialized_only=True):
                conn.close()
            time.sleep(min(1.0, self.settings.POLL_INTERVAL))
        except Exception:
            logger.exception("error in the worker loop; carrying on")
        return None

    def _claim(self, limit: int) -> list[store.ClaimedJob]:
        return store.jobs_claim(
            worker_id=self.options.worker_id,
            queues=self.options.queues,
            limit=limit,
            lease_seconds=self.settings.LEASE_SECONDS,
            db=self.db,
            namespace=self.options.namespace,
            poll_interval=self.settings.POLL_INTERVAL,  # how stale a pause may be seen
            placement=self._placement(),
        )

    def _placement(self) -> store.resources.Placement | None:
        opts = self.options
        starve = self.settings.RESOURCE_STARVATION_SECONDS
        return self.slots.placement(opts.capacity, opts.locality, starve)

    def _start(self, claimed: list[store.ClaimedJob]) -> None:
        """Hand each claimed job to a job thread, or, with an asyncio executor,
        an async job to its event loop (resolving the task here: its module is
        imported once, then it is a lookup)."""
        on_loop: list[executor.RunningJob] = []
        for job in claimed:
            running = executor.RunningJob(claimed=job, lease_seconds=self.settings.LEASE_SECONDS)
            lane = self.async_jobs is not None and executor.is_async(running)
            running.on_loop = lane
            with self.slots.lock:
                self.slots.running[job.id] = running
            if lane:
                on_loop.append(running)
            else:
                self.pool.submit(running)
        if self.async_jobs is not None:
            if on_loop:
                self.async_jobs.submit(on_loop)
            self.slots.learn(len(on_loop), len(claimed))
        self.claimed_total += len(claimed)

    def heartbeat(self) -> None:
        """Renew every lease this worker holds; stop the jobs it lost."""
        with self.slots.lock:
            leases = [r.claimed.lease for r in self.slots.running.values()]
        lost = store.jobs_renew_leases(
            leases, lease_seconds=self.settings.LEASE_SECONDS, db=self.db
        )
        for job_id in lost:
            with self.slots.lock:
                running = self.slots.running.get(job_id)
            if running is not None and not running.cancel_event.is_set():
                logger.info(
                    "job %s: cancelled or lost; asking it to stop",
                    job_id,
                    extra=events.job_fields(running.claimed),
                )
                running.stop()
                self.overseer.asked_to_stop(running, time.monotonic())
        if metrics.WORKER is not None:
            metrics.WORKER.heartbeat(
                busy=len(leases), slots=self.options.concurrency + self.options.async_concurrency
            )
        # Recreates the row if the leader deleted it (after a long pause).
        store.worker_touch(self.options.worker_id, running_jobs=len(leases), **self.registration)

    def recycle(self) -> None:
        """Stop claiming; once the other jobs are done, ``run()`` prepares the handover."""
        if not self.recycling:
            self.recycle_deadline = time.monotonic() + self.options.shutdown_timeout
        self.recycling = True
        self.stopping = True
        self.wakeup.set()

    def _ready_to_recycle(self, now: float) -> bool:
        """Whether the jobs running beside the stuck one are done, or may wait no longer.

        Re-executing the process ends them too: they get up to the shutdown
        timeout to finish first, so that a task that keeps ignoring its
        timeout cannot make the jobs beside it start over again and again.
        Those still running then are handed back (no attempt spent).
        """
        with self.slots.lock:
            others = [
                job_id for job_id in self.slots.running if job_id not in self.overseer.overtime
            ]
        return not others or self.force_stop or now >= self.recycle_deadline

    def _handover(self) -> recycling.Handover:
        """List every job still held, for the process that will replace this one.

        Successes already returned are written first, and the leases renewed
        once more, so the successor has a whole lease to settle the rest in.
        Jobs no thread has started yet never start here.
        """
        self._guard(lambda: self.cycle(claim=False))
        self._guard(self.heartbeat)
        with self.slots.lock:
            for job_id, running in self.slots.running.items():
                if job_id not in self.slots.threads:
                    running.abandoned = True
            jobs = list(self.slots.running.values())
            timed_out = {
                i for i, over in self.overseer.overtime.items() if over.reason == "timeout"
            }
        return recycling.handover_of(
            self.options.worker_id, self.claimed_total, jobs, timed_out=timed_out
        )

    def give_up(self, running: executor.RunningJob, overtime: timeouts.Overtime) -> None:
        """Without recycling: record the timeout, free the slot, let the thread run on."""
        with self.slots.lock:
            self.slots.running.pop(running.claimed.id, None)
            thread = self.slots.threads.get(running.claimed.id)
            if thread is not None:  # its code still runs: it still holds its resources (#16)
                self.slots.lingering[running.claimed.id] = running
        self.pool.retire(thread)
        self._guard(
            lambda: completer.record_timeout(
                running.claimed,
                overtime.timeout,
                how="its thread was given up on (it may still be running, but can no longer "
                "write to the job)",
                give_up_after=self.settings.LEASE_SECONDS,
                task=running.task,
            )
        )

    def release_unstarted(self) -> None:
        """At a stop: hand back the jobs no thread has started (claimed ahead,
        ``Slots.ahead``), at once and without spending an attempt, rather
        than run them during the shutdown timeout."""
        self._give_back(self.slots.take_unstarted())

    def _give_back(self, unstarted: list[executor.RunningJob]) -> None:
        """Hand back jobs no thread started, taken out of the slots: fenced by
        their leases, no attempt spent. They no longer count as claimed here
        (``--max-jobs``, ``testing.drain``'s count): this worker did not run them."""
        self.claimed_total -= len(unstarted)
        for running in unstarted:
            self._guard(
                lambda running=running: completer.hand_back(
                    running.claimed,
                    timed_out=None,
                    give_up_after=self.settings.LEASE_SECONDS,
                    task=None,
                )
            )

    def hand_back(self) -> None:
        """Return unfinished jobs to the queue without spending an attempt."""
        self.handed_back = True
        with self.slots.lock:
            # A success waiting for its wave is written by the last one, not handed back.
            unfinished = [
                (running, self.overseer.overtime.get(job_id))
                for job_id, running in self.slots.running.items()
                if running.finished is None
            ]
            for running, _ in unfinished:
                running.abandoned = True
        for running, over in unfinished:
            running.stop()
            timed_out = over.timeout if over is not None and over.reason == "timeout" else None
            self._guard(
                lambda running=running, timed_out=timed_out: completer.hand_back(
                    running.claimed,
                    timed_out=timed_out,
                    give_up_after=self.settings.LEASE_SECONDS,
                    task=running.task,
                )
            )
