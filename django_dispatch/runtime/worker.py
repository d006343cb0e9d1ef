"""One worker process: a control loop and a pool of job threads.

The control loop (the main thread) never runs task code. It claims jobs up to
the free slots, renews the leases of running jobs on a fixed heartbeat,
returns expired leases of dead workers to the queue, enforces timeouts, and
drives graceful shutdown. Because task code runs only on job threads, a
CPU-bound or blocking task cannot stop the heartbeat that keeps its lease.
A job over its timeout, or cancelled, that does not stop within the grace
period is ended by recycling the process (see ``timeouts``).

Database connections, fixed and documented: one per job thread, one for the
control loop, and on PostgreSQL with LISTEN on, one for the listener:
``concurrency + 2`` (``+ 1`` without LISTEN). In a worker that cannot
recycle (run in-process), a thread given up on after a timeout keeps its
connection until the task function returns.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

from django.db import DatabaseError, InterfaceError, connections, transaction

from .. import store
from ..conf import DispatchSettings, get_settings
from . import completer, executor, scheduler, timeouts
from .connections import ThreadConnections, database_went_away
from .listener import Listener, listener_params
from .maintenance import Maintenance

logger = logging.getLogger("django_dispatch.worker")

#: Most successes written by one batched UPDATE.
COMPLETION_BATCH = 200
#: Longest wait for the rest of a wave of finishing jobs (see _coalesce).
COALESCE_SECONDS = 0.002
#: A second stop signal within this many seconds is the same request.
SIGNAL_DEDUP_SECONDS = 1.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


@dataclass
class WorkerOptions:
    worker_id: str
    queues: Sequence[str] = ()
    concurrency: int = 4
    burst: bool = False
    max_jobs: int | None = None
    shutdown_timeout: float = 30.0
    scheduler: bool = True  # run the cron scheduler (--no-scheduler turns it off)
    #: End task code that ignores a stop request by recycling the process
    #: (``rundispatch`` only: see ``timeouts.can_recycle``).
    recycle: bool = False
    #: What the process this one replaced left to settle (see ``timeouts``).
    predecessor: timeouts.Handover | None = None


class Every:
    """A duty of the control loop, run every ``interval`` seconds."""

    def __init__(self, interval: float, run: Callable[[], object], *, start_now: bool = True):
        self.interval = interval
        self.run = run
        self.next_at = time.monotonic() + (0.0 if start_now else interval)

    def due(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.next_at = now + self.interval
        return True


class JobThreads:
    """Long-lived job threads, each keeping its own database connection.

    In a worker that cannot recycle its process, a thread given up on after a
    timeout is *retired*: it no longer counts as a slot, finishes its task
    function in the background, gets its late write rejected by the fence,
    and exits. A fresh thread takes its place so the worker keeps its
    concurrency.
    """

    def __init__(self, worker: Worker, size: int) -> None:
        self.worker = worker
        self.inbox: queue.SimpleQueue[executor.RunningJob | None] = queue.SimpleQueue()
        self.retired: set[threading.Thread] = set()
        self.threads: list[threading.Thread] = []
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(target=self._loop, name="dispatch-job", daemon=True)
        self.threads.append(thread)
        thread.start()

    def submit(self, running: executor.RunningJob) -> None:
        self.inbox.put(running)

    def retire(self, thread: threading.Thread | None) -> None:
        if thread is not None and thread in self.threads:
            self.threads.remove(thread)
            self.retired.add(thread)
            self._spawn()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop idle threads and wait for them (retired ones may be stuck in task code)."""
        for _ in self.threads:
            self.inbox.put(None)
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        me = threading.current_thread()
        conns = ThreadConnections()
        try:
            while me not in self.retired:
                running = self.inbox.get()
                if running is None:
                    return
                try:
                    self.worker.run_job(running, conns)
                except BaseException:  # never lose a job thread silently
                    logger.exception("job thread crashed; it carries on")
        finally:
            connections.close_all()


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
        self.running: dict[int, executor.RunningJob] = {}
        self.threads_by_job: dict[int, threading.Thread] = {}
        self.lock = threading.Lock()
        self.claimed_total = 0
        self.completions: queue.SimpleQueue[executor.RunningJob] = queue.SimpleQueue()
        self.listener: Listener | None = None
        self.signalled_at: float | None = None
        #: When running jobs are handed back. None while draining after
        #: --burst or --max-jobs: those jobs run to completion.
        self.stop_deadline: float | None = None
        self.handed_back = False
        self.overseer = timeouts.Overseer(self)
        #: Set once a job ignored its stop request past the grace period: the
        #: loop ends and ``handover`` lists the jobs for the successor process.
        self.recycling = False
        self.recycle_deadline = 0.0  # monotonic; see _ready_to_recycle
        self.handover: timeouts.Handover | None = None
        if options.predecessor is not None:
            self.claimed_total = options.predecessor.claimed

    # --- job threads ---------------------------------------------------------

    def run_job(self, running: executor.RunningJob, conns: ThreadConnections) -> None:
        """Executed on a job thread: check the connection, run, persist, free the slot."""
        job_id = running.claimed.id
        with self.lock:
            if running.abandoned:  # handed back before a thread picked it up
                return
            self.threads_by_job[job_id] = threading.current_thread()
        outcome: executor.Outcome | None = None
        try:
            try:
                conns.ready_for_task(self.db)
            except (DatabaseError, InterfaceError):
                # The database is unreachable and task code has not started:
                # the job goes back as if never claimed (written once the
                # database answers, or reclaimed if it never does).
                logger.warning("job %s: database unreachable before it started", job_id)
                database_went_away()
                outcome = executor.Outcome(kind="released")
                completer.persist(
                    running.claimed, outcome, give_up_after=self.settings.LEASE_SECONDS
                )
                return
            self.overseer.started(running)
            outcome = executor.execute(running.claimed, running)
            overtime = self.overseer.returned(running)
            if running.abandoned:
                outcome = executor.Outcome(kind="discarded", task_result=outcome.task_result)
            elif overtime is not None and overtime.reason == "timeout":
                # Stopped within the grace period; the lease was held meanwhile.
                outcome = timeouts.timeout_outcome(
                    running.claimed, overtime.timeout, how="it was asked to stop, and did"
                )
            if not self._finished_in_batch(running, outcome):
                completer.persist(
                    running.claimed, outcome, give_up_after=self.settings.LEASE_SECONDS
                )
        except Exception as e:
            # A bug of ours must not kill the thread, nor leave the job
            # running until its lease expires: fail it (fenced) and go on.
            logger.exception("job %s: unexpected error in the worker", job_id)
            outcome = executor.classify_failure(running.claimed, e, task=None, retryable=False)
            self._guard(lambda: completer.persist(running.claimed, outcome, give_up_after=1))
        finally:
            if outcome is not None and outcome.kind == "interrupted":
                database_went_away()  # the other threads' connections may be broken too
            self._reset_connections()
            conns.done()
            with self.lock:
                if self.running.get(job_id) is running:
                    del self.running[job_id]
                self.threads_by_job.pop(job_id, None)
            self.wakeup.set()

    def _finished_in_batch(self, running: executor.RunningJob, outcome: executor.Outcome) -> bool:
        """Hand a success to the control loop's next batched write; False if not batchable.

        Waits until the batch is written, then sends ``task_finished`` from
        this thread (signal receivers are user code: never on the control
        loop). Failures take the per-job path.
        """
        if outcome.kind != "succeeded":
            return False
        running.finished = outcome
        self.completions.put(running)
        self.wakeup.set()
        if not running.persisted.wait(timeout=self.settings.LEASE_SECONDS):
            return False  # the control loop is stuck: write it ourselves (fenced)
        if running.won is None:  # the batch write failed: write it ourselves
            return False
        if running.won:
            completer.signal_finished(outcome)
        else:
            completer.log_lost(running.claimed.lease, outcome)
            # If it was cancelled, let go of it (which frees its partition).
            store.job_ack_cancelled(
                running.claimed.lease, partition_key=running.claimed.row["partition_key"]
            )
        return True

    def cycle(self, claim: bool = True) -> int:
        """One round trip's worth of work: record finished jobs, claim new ones.

        Successes waiting in ``completions`` are written by one fenced UPDATE
        and the slots they free are refilled by the claim, in one transaction:
        a single commit (one WAL flush) per wave of jobs. Job threads learn
        the outcome only after the commit; if it fails, they write their own
        outcome one by one. Returns the number of jobs claimed.
        """
        batch: list[executor.RunningJob] = []
        while len(batch) < COMPLETION_BATCH:
            try:
                batch.append(self.completions.get_nowait())
            except queue.Empty:
                break
        limit = self._free_slots() + len(batch) if claim else 0
        if self.options.max_jobs is not None:
            limit = min(limit, self.options.max_jobs - self.claimed_total)
        if not batch and limit <= 0:
            return 0
        results = [(r.claimed.lease, r.finished.return_value) for r in batch if r.finished]
        try:
            with transaction.atomic(using=self.db):
                won = store.jobs_finish_many_if_leased(results, db=self.db)
                claimed = self._claim(limit) if limit > 0 else []
        except BaseException:
            for running in batch:
                running.won = None
                running.persisted.set()
            raise
        with self.lock:
            for running in batch:
                if self.running.get(running.claimed.id) is running:
                    del self.running[running.claimed.id]
        for running in batch:
            running.won = running.claimed.id in won
            running.persisted.set()
        self._start(claimed)
        return len(claimed)

    @staticmethod
    def _reset_connections() -> None:
        """Keep a job thread's connection across jobs unless a task broke it."""
        for conn in connections.all(initialized_only=True):
            if conn.in_atomic_block:
                logger.error("a task left a transaction open; rolling it back")
                conn.close()
            elif conn.errors_occurred and not conn.is_usable():
                conn.close()
            else:
                conn.errors_occurred = False

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
            logger.warning("second %s: handing back running jobs now", signal.Signals(signum).name)
            self.force_stop = True
            self.wakeup.set()
        else:
            self.request_stop(signal.Signals(signum).name)

    def request_stop(self, why: str) -> None:
        """Stop claiming; let running jobs finish within the shutdown timeout."""
        now = time.monotonic()
        if self.signalled_at is None:
            self.signalled_at = now
        logger.info(
            "%s: no new claims; waiting up to %s s for running jobs",
            why,
            self.options.shutdown_timeout,
        )
        self.stopping = True
        self.stop_deadline = now + self.options.shutdown_timeout
        self.wakeup.set()

    def run(self) -> int:
        opts, cfg = self.options, self.settings
        self.pool = pool = JobThreads(self, opts.concurrency)
        maintenance = Maintenance(opts.worker_id, cfg, self.db)
        try:
            store.worker_register(
                opts.worker_id,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                queues=opts.queues,
                concurrency=opts.concurrency,
            )
            logger.info(
                "worker %s started: queues=%s concurrency=%s",
                opts.worker_id,
                list(opts.queues) or "all",
                opts.concurrency,
            )
            self._start_listener()
            if opts.predecessor is not None:
                timeouts.settle(opts.predecessor, lease_seconds=cfg.LEASE_SECONDS, db=self.db)
            if opts.scheduler:
                self._guard(scheduler.sync_from_settings)
            self._loop(maintenance)
            if self.recycling:
                self.handover = self._handover()
        finally:
            self._guard(lambda: self.cycle(claim=False))
            # Threads still in task code after a hand-back are not waited for:
            # their jobs are back in the queue, and exiting ends them. Nor
            # after a recycle: the successor settles their jobs once
            # re-executing the process has ended them.
            pool.stop(timeout=0.0 if self.handed_back or self.recycling else 5.0)
            if self.listener:
                self.listener.stop()
                self.listener.join(timeout=2.0)
            self._guard(maintenance.resign)
            self._guard(lambda: store.worker_deregister(opts.worker_id))
            if self.close_connections:
                connections.close_all()
        logger.info(
            "worker %s %s (%s jobs claimed)",
            opts.worker_id,
            "stopped" if self.handover is None else "ends its process to recycle it",
            self.claimed_total,
        )
        return 0

    def _loop(self, maintenance: Maintenance) -> None:
        opts, cfg = self.options, self.settings
        # Periodic duties of the control loop, all but the heartbeat run once
        # at start (a crashed predecessor's expired leases are swept at once
        # if this worker is the leader).
        duties = [
            Every(cfg.HEARTBEAT_INTERVAL, self.heartbeat, start_now=False),
            Every(cfg.HEARTBEAT_INTERVAL, maintenance.elect),
            Every(cfg.RECLAIM_INTERVAL, maintenance.reclaim),
            Every(cfg.PURGE_INTERVAL, maintenance.purge),
            Every(cfg.PURGE_INTERVAL, maintenance.unstick_partitions),
        ]
        if opts.scheduler:
            duties.append(Every(cfg.SCHEDULER_INTERVAL, scheduler.tick))
        while True:
            now = time.monotonic()
            for duty in duties:
                if duty.due(now):
                    self._guard(duty.run)
            self.overseer.check(now)
            if self.recycling and self._ready_to_recycle(now):
                break

            if self.stopping:
                self._guard(lambda: self.cycle(claim=False))
                if not self.running:
                    break
                deadline = self.stop_deadline
                if self.force_stop or (deadline is not None and now >= deadline):
                    self.hand_back()
                    break
            else:
                claimed = self._guard(self.cycle) or 0
                if self._done(claimed):
                    self.stopping = True
                    continue
                if claimed and self._free_slots():
                    continue  # more may be waiting: claim again at once
            next_duty = min(duty.next_at for duty in duties)
            self.wakeup.wait(min(cfg.POLL_INTERVAL, max(0.0, next_duty - time.monotonic())))
            self.wakeup.clear()
            self._coalesce()

    def _coalesce(self) -> None:
        """Let a wave of finishing jobs gather before writing it.

        Short jobs finish within microseconds of each other; waiting up to
        ``COALESCE_SECONDS`` for the rest of the wave turns many one-row
        completions (each a transaction and a claim) into one.
        """
        if self.completions.empty():
            return
        deadline = time.monotonic() + COALESCE_SECONDS
        while self.completions.qsize() < len(self.running) and time.monotonic() < deadline:
            time.sleep(COALESCE_SECONDS / 8)

    def _done(self, claimed: int) -> bool:
        opts = self.options
        if opts.max_jobs is not None and self.claimed_total >= opts.max_jobs:
            return True
        if not (opts.burst and claimed == 0 and not self.running):
            return False
        # An empty claim is not an empty queue: jobs may wait behind a
        # partition head that another worker is running.
        due = self._guard(lambda: store.jobs_due_exist(queues=opts.queues, db=self.db))
        return due is False  # None: the database did not answer; keep going

    def _free_slots(self) -> int:
        with self.lock:
            return self.options.concurrency - len(self.running)

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

    def _start_listener(self) -> None:
        connection = connections[self.db]
        if not self.settings.LISTEN or connection.vendor != "postgresql":
            return
        connection.ensure_connection()
        self.listener = Listener(
            listener_params(connection),
            self.wakeup,
            health_interval=self.settings.HEARTBEAT_INTERVAL,
        )
        self.listener.start()

    def _claim(self, limit: int) -> list[store.ClaimedJob]:
        return store.jobs_claim(
            worker_id=self.options.worker_id,
            queues=self.options.queues,
            limit=limit,
            lease_seconds=self.settings.LEASE_SECONDS,
            db=self.db,
        )

    def _start(self, claimed: list[store.ClaimedJob]) -> None:
        for job in claimed:
            running = executor.RunningJob(claimed=job, lease_seconds=self.settings.LEASE_SECONDS)
            with self.lock:
                self.running[job.id] = running
            self.pool.submit(running)
        self.claimed_total += len(claimed)

    def heartbeat(self) -> None:
        """Renew every lease this worker holds; stop the jobs it lost."""
        with self.lock:
            leases = [r.claimed.lease for r in self.running.values()]
        lost = store.jobs_renew_leases(
            leases, lease_seconds=self.settings.LEASE_SECONDS, db=self.db
        )
        for job_id in lost:
            with self.lock:
                running = self.running.get(job_id)
            if running is not None and not running.cancel_event.is_set():
                logger.info("job %s: cancelled or lost; asking it to stop", job_id)
                running.stop()
                self.overseer.asked_to_stop(running, time.monotonic())
        store.worker_touch(  # recreates the row if the leader deleted it (a long pause)
            self.options.worker_id,
            running_jobs=len(leases),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            queues=self.options.queues,
            concurrency=self.options.concurrency,
            db=self.db,
        )

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
        with self.lock:
            others = [job_id for job_id in self.running if job_id not in self.overseer.overtime]
        return not others or self.force_stop or now >= self.recycle_deadline

    def _handover(self) -> timeouts.Handover:
        """List every job still held, for the process that will replace this one.

        Successes already returned are written first, and the leases renewed
        once more, so the successor has a whole lease to settle the rest in.
        Jobs no thread has started yet never start here.
        """
        self._guard(lambda: self.cycle(claim=False))
        self._guard(self.heartbeat)
        with self.lock:
            for job_id, running in self.running.items():
                if job_id not in self.threads_by_job:
                    running.abandoned = True
            jobs = list(self.running.values())
            timed_out = {
                job_id
                for job_id, over in self.overseer.overtime.items()
                if over.reason == "timeout"
            }
        rest = [r for r in jobs if r.claimed.id not in timed_out]
        return timeouts.Handover(
            worker_id=self.options.worker_id,
            claimed=self.claimed_total,
            timed_out=timeouts.entries(r for r in jobs if r.claimed.id in timed_out),
            stopped=timeouts.entries(r for r in rest if r.cancel_event.is_set()),
            released=timeouts.entries(r for r in rest if not r.cancel_event.is_set()),
        )

    def give_up(self, running: executor.RunningJob, overtime: timeouts.Overtime) -> None:
        """Without recycling: record the timeout, free the slot, let the thread run on."""
        with self.lock:
            self.running.pop(running.claimed.id, None)
            thread = self.threads_by_job.get(running.claimed.id)
        self.pool.retire(thread)
        self._record_timeout(
            running,
            overtime,
            how="its thread was given up on (it may still be running, but can no longer "
            "write to the job)",
        )

    def _record_timeout(
        self, running: executor.RunningJob, overtime: timeouts.Overtime, *, how: str
    ) -> None:
        outcome = timeouts.timeout_outcome(running.claimed, overtime.timeout, how=how)
        won = self._guard(
            lambda: completer.persist(
                running.claimed, outcome, give_up_after=self.settings.LEASE_SECONDS, signal=False
            )
        )
        if won:  # receivers are user code: never on the control loop
            threading.Thread(
                target=completer.signal_finished_and_close, args=(outcome,), daemon=True
            ).start()
        logger.warning(
            "job %s: timed out after %s s; %s",
            running.claimed.id,
            overtime.timeout,
            "recorded" if won else "already finished or lost",
        )

    def hand_back(self) -> None:
        """Return unfinished jobs to the queue without spending an attempt."""
        self.handed_back = True
        with self.lock:
            unfinished = [
                (running, self.overseer.overtime.get(job_id))
                for job_id, running in self.running.items()
            ]
            for running, _ in unfinished:
                running.abandoned = True
        for running, overtime in unfinished:
            row = running.claimed.row
            running.stop()
            if overtime is not None and overtime.reason == "timeout":
                # Over its timeout already: the attempt counts.
                self._record_timeout(running, overtime, how="its worker shut down meanwhile")
                continue
            released = self._guard(
                lambda row=row, running=running: store.job_release_if_leased(
                    running.claimed.lease,
                    attempts=row["attempts"] - 1,
                    worker_ids=row["worker_ids"][:-1],
                    db=self.db,
                )
            )
            if not released:  # cancelled meanwhile: let go of it, freeing its partition
                self._guard(
                    lambda running=running: store.job_ack_cancelled(
                        running.claimed.lease, partition_key=running.claimed.row["partition_key"]
                    )
                )
            logger.warning(
                "job %s: %s",
                running.claimed.id,
                "handed back to the queue" if released else "already finished or lost",
            )
