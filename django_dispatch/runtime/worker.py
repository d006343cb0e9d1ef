"""One worker process's lifecycle: start, signals, stop, recycle, hand back.

A worker is a few roles, a module each. The producer (``producer``) runs the
control loop on the main thread: it claims jobs up to the free slots
(``slots``) and starts them. The job threads (``jobthreads``) run one
attempt each (``attempt``), which the executor classifies without I/O
(``executor``). The completer (``completer``) is the only writer of an
attempt's end: successes in waves written inside the claim's transaction,
anything else one by one. The heartbeat (``heartbeat``) renews the leases
of running jobs. The overseer finds jobs over their timeout (``timeouts``),
and a job that does not stop within the grace period is ended by recycling
the process (``recycling``). This module only decides when each starts and
ends: on a signal, at ``--burst``'s or ``--max-jobs``' end, on a recycle.
Task code runs only on job threads: it cannot stop the heartbeat.

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
import threading
import time
from types import FrameType

from django.db import connections

from .. import store
from ..conf import DispatchSettings, get_settings
from ..observability import joblog
from . import completer, recycling, scheduler, takeover, timeouts
from .asyncjobs import AsyncJobs
from .heartbeat import Heartbeat
from .jobthreads import JobRunner, JobThreads
from .listener import Listener, start_listener
from .maintenance import Maintenance
from .options import Every, WorkerOptions
from .producer import Producer
from .running import RunningJob
from .slots import PREFETCH_FACTOR, Slots

logger = logging.getLogger("django_dispatch.worker")

#: A second stop signal within this many seconds is the same request.
SIGNAL_DEDUP_SECONDS = 1.0
#: How often a ``--processes`` child checks that its supervisor is alive.
SUPERVISOR_CHECK_SECONDS = 1.0


class Worker:
    #: The producer class (``inline`` gives one whose claim is already made).
    producer_class: type[Producer] = Producer

    def __init__(
        self,
        options: WorkerOptions,
        settings: DispatchSettings | None = None,
        *,
        close_connections: bool = True,
    ) -> None:
        self.options = options
        self.close_connections = close_connections
        self.settings = cfg = settings or get_settings()
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
            prefetch=PREFETCH_FACTOR * options.concurrency if postgres else 0,
        )
        #: What the worker row says about this process (see ``store.workers``).
        self.registration = takeover.registration(options, self.db)
        self.completer = completer.BatchCompleter(
            self.wakeup, cfg.LEASE_SECONDS, slots=self.slots, db=self.db
        )
        self.producer = self.producer_class(
            options, cfg, db=self.db, slots=self.slots, batch=self.completer
        )
        self.overseer = timeouts.Overseer(self.slots.lock, cfg.TIMEOUT_GRACE)
        self.heartbeat = Heartbeat(
            self.slots,
            self.overseer,
            worker_id=options.worker_id,
            registration=self.registration,
            lease_seconds=cfg.LEASE_SECONDS,
            db=self.db,
            capacity=options.concurrency + options.async_concurrency,
        )
        self.heartbeat.on_taken = self.request_stop
        self.listener: Listener | None = None
        self.async_jobs: AsyncJobs | None = None  # --async-concurrency: made in run()
        self.signalled_at: float | None = None
        #: When running jobs are handed back. None while draining after
        #: --burst or --max-jobs: those jobs run to completion.
        self.stop_deadline: float | None = None
        self.handed_back = False
        #: Set once a job ignored its stop request past the grace period: the
        #: loop ends and ``handover`` lists the jobs for the successor process.
        self.recycling = False
        self.recycle_deadline = 0.0  # monotonic; see _ready_to_recycle
        self.handover: recycling.Handover | None = None

    @property
    def claimed_total(self) -> int:
        """Jobs this worker claimed and did not give back (``testing.drain``, ``--max-jobs``)."""
        return self.producer.claimed_total

    # --- signals ---------------------------------------------------------------

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
        return joblog.worker_fields(self.options.worker_id, **more)

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

    def drain(self) -> None:
        """Nothing more to claim (``--burst``, ``--max-jobs``): let running jobs finish."""
        self.stopping = True

    # --- start and stop --------------------------------------------------------

    def run(self) -> int:
        opts, cfg = self.options, self.settings
        takeover.take_id(opts, self.registration, cfg)  # before the try: a refusal leaves its row
        runner = JobRunner(
            self.slots,
            self.overseer,
            self.completer,
            lease_seconds=cfg.LEASE_SECONDS,
            db=self.db,
        )
        self.completer.start()
        self.pool = self.producer.pool = JobThreads(runner, opts.concurrency)
        self.async_jobs = AsyncJobs(runner) if opts.async_concurrency else None
        self.producer.async_jobs = self.async_jobs
        maintenance = Maintenance(opts.worker_id, cfg, self.db, opts.namespace)
        try:
            self._start()
            self._loop(maintenance)
            if self.recycling:
                self.handover = self._handover()
        finally:
            self._shut_down(maintenance)
        joblog.worker_stopped(
            opts.worker_id, self.claimed_total, recycling=self.handover is not None
        )
        return 0

    def _start(self) -> None:
        """Register, listen, settle what a recycled predecessor left, sync cron."""
        opts, cfg = self.options, self.settings
        taken = takeover.register(opts.worker_id, self.registration)
        if taken is not None:  # stop before claiming, listening or settling anything
            self.request_stop(taken)
            return
        joblog.worker_started(opts.worker_id, opts.queues, opts.concurrency)
        self.listener = start_listener(self.db, cfg, self.wakeup, namespace=opts.namespace)
        if opts.predecessor is not None:
            recycling.settle(
                opts.predecessor,
                lease_seconds=cfg.LEASE_SECONDS,
                db=self.db,
                namespace=opts.namespace,
            )
        if opts.scheduler:
            self._guard(lambda: scheduler.sync_from_settings(namespace=opts.namespace))

    def _shut_down(self, maintenance: Maintenance) -> None:
        """Write the last wave, stop every thread, leave the worker table."""
        opts = self.options
        self.producer.flush()
        self.completer.stop()  # after the last wave: its successes are reported
        # Threads still in task code after a hand-back are not waited for:
        # their jobs are back in the queue, and exiting ends them. Nor
        # after a recycle: the successor settles their jobs once
        # re-executing the process has ended them.
        wait = 0.0 if self.handed_back or self.recycling else 5.0
        self.pool.stop(timeout=wait)
        if self.async_jobs is not None:
            self.async_jobs.stop(timeout=wait)
        if self.listener:
            self.listener.stop()
            self.listener.join(timeout=2.0)
        self._guard(maintenance.resign)
        self._guard(lambda: store.worker_deregister(opts.worker_id, **self.heartbeat.owner))
        if self.close_connections:
            connections.close_all()

    def _loop(self, maintenance: Maintenance) -> None:
        opts, cfg = self.options, self.settings
        duties = [
            Every(cfg.HEARTBEAT_INTERVAL, self.heartbeat.beat, start_now=False),
            *maintenance.duties(cron=opts.scheduler),
        ]
        if opts.supervisor_pid is not None:
            duties.append(Every(SUPERVISOR_CHECK_SECONDS, self._watch_supervisor))
        self.producer.run(duties, self)

    def turn(self, now: float) -> bool:
        """The lifecycle's share of one turn of the loop; True: the loop ends.

        Atomic successes waiting too long behind a body that turned out long
        go back (``AtomicGroup.stuck``); jobs over their timeout are asked to
        stop and late ones ended (``timeouts``); a recycle waits for the other
        jobs; a stopping worker writes its last waves and, at the shutdown
        timeout, hands back what still runs.
        """
        shutting_down = self.signalled_at is not None
        self._guard(lambda: self.pool.forsake_groups(stuck_at=now))
        verdict = self.overseer.check(now, self.slots.running, self.options.recycle, shutting_down)
        timeouts.act(verdict, self.recycling, give_up=self.give_up, recycle=self.recycle)
        if self.recycling and self._ready_to_recycle(now):
            return True
        if not self.stopping:
            return False
        if self.slots.stopping and not self.recycling:
            self._guard(self.release_unstarted)
        self._guard(lambda: self.producer.cycle(claim=False))
        if not self.slots.running:
            return True
        deadline = self.stop_deadline
        if self.force_stop or (deadline is not None and now >= deadline):
            self.hand_back()
            return True
        return False

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

    def _guard(self, step):
        """Run one control-loop step; a database outage or a bug is logged, never fatal."""
        return self.producer.guard(step)

    # --- recycle and hand back -------------------------------------------------

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
        self._guard(lambda: self.producer.cycle(claim=False))
        self._guard(self.heartbeat.beat)
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

    def give_up(self, running: RunningJob, overtime: timeouts.Overtime) -> None:
        """Without recycling: record the timeout, free the slot, let the thread run on."""
        with self.slots.lock:
            self.slots.running.pop(running.claimed.id, None)
            thread = self.slots.threads.get(running.claimed.id)
            if thread is not None:  # its code still runs: it still holds its resources
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
        self.producer.give_back(self.slots.take_unstarted(), why="handed back at shutdown")

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
        # A success waiting in a group's transaction goes back too: that
        # transaction ends with the process.
        self._guard(self.pool.forsake_groups)
