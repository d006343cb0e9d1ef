"""Persist jobs' outcomes: the writer of an attempt's end, always fenced.

The one exception is an atomic task's success, which must commit with the
task's own writes: ``atomic`` writes it in the task's transaction.

Successes go in waves (``BatchCompleter``): a job hands its success over
(``hand_over``) and goes on; the completer writes the wave with one fenced
UPDATE, in the same transaction as the claim that refills the slots the
wave frees (``write_wave``), or as one statement with that claim
(``write_fused``, ``store.wave``), then wakes each job's reporter
(``settle``, or ``abort`` when the write failed). Every other outcome, and a
success whose wave could not be written, is written one by one
(``outcomes``, re-exported here: ``persist``, ``hand_back``,
``record_timeout``, ``release``, ``let_go``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db import transaction

from .. import store
from ..conf import usage_recorded
from ..observability import joblog
from ..store.finish import Measured
from ..store.usage import UsageEntry
from ..store.wave import WaveClaim, jobs_finish_many_and_claim, wave_promote_freed
from ..store.workflows import mapwave
from . import metering
from .executor import Outcome
from .followups import FollowUps, run
from .outcomes import hand_back, let_go, persist, record_timeout, release, usage_outcome
from .reporter import Reporter, settle_quietly, signal_finished
from .running import RunningJob
from .slots import COMPLETION_BATCH, Slots

__all__ = [
    "BatchCompleter",
    "hand_back",
    "let_go",
    "persist",
    "record_timeout",
    "release",
    "usage_outcome",
]

logger = logging.getLogger("django_dispatch.worker")

#: Longest wait for the rest of a wave of finishing jobs (see ``coalesce``).
COALESCE_SECONDS = 0.002


class BatchCompleter:
    """Successes written in waves, in the transaction that claims the slots they free.

    A job hands its success over (``hand_over``, ``offer``) and does not
    wait: a job thread goes on to its next job, a job on the event loop
    awaits the wave without a thread. The control loop's producer asks for
    a wave (``take``) and has it written (``write_wave``): one fenced UPDATE
    and the claim in one transaction, one commit, one WAL flush per wave of
    jobs. After the commit each job learns whether its write won
    (``settle``) or that the transaction failed (``abort``) through its
    ``on_persisted``: the ``Reporter`` for a thread's job, the event loop
    for an async one. ``task_finished`` is sent there, never on the control
    loop: its receivers are user code.
    """

    def __init__(
        self,
        wakeup: threading.Event,
        wait_seconds: float,
        *,
        slots: Slots | None = None,
        db: str | None = None,
    ) -> None:
        self.wakeup = wakeup
        self.wait_seconds = wait_seconds  # about a lease: then write it yourself
        self.waiting: queue.SimpleQueue[RunningJob] = queue.SimpleQueue()
        #: ``take`` against ``withdraw``: a success goes to a wave or is withdrawn, never both.
        self.taking = threading.Lock()
        self.slots = slots
        self.db = db or store.db_alias()
        #: Report waves' successes, run what their map children leave to do.
        self.reporter: Reporter | None = None
        self.followups: FollowUps | None = None
        #: Jobs of concurrency groups the last one-statement wave passed by
        #: (``write_fused``): only the gates may claim them.
        self.passed = 0

    def start(self) -> None:
        """Start the reporter thread (``Worker.run``): waves may be written from now on."""
        self.reporter = Reporter(self.report)
        self.followups = FollowUps(self.db)

    def stop(self) -> None:
        """After the last wave: report what is queued, then end the reporter."""
        if self.reporter is not None:
            self.reporter.stop()
        if self.followups is not None:
            self.followups.stop()

    def hand_over(self, running: RunningJob, outcome: Outcome, meter: metering.Meter) -> bool:
        """On a job thread: a success joins the next wave and the thread goes on.

        False (the caller writes and reports it itself, ``persist``) for
        anything but a success, without a reporter, and while the reporter is
        behind (``Reporter.behind``).
        """
        reporter = self.reporter
        if outcome.kind != "succeeded" or reporter is None or reporter.behind():
            return False
        running.meter = meter
        if outcome.task_result is None:  # no task_finished to send (attempt.prepare)
            running.on_persisted = partial(settle_quietly, running, reporter)
        else:
            running.on_persisted = partial(reporter.put, running)
        return self.offer(running, outcome)

    def offer(self, running: RunningJob, outcome: Outcome) -> bool:
        """Queue a success for the next wave (no waiting); False if not batchable."""
        if outcome.kind != "succeeded":
            return False
        running.finished = outcome
        self.waiting.put(running)
        self.wake()
        return True

    def wake(self) -> None:
        """Wake the control loop, unless it is awake already: it clears the flag
        before it reads the waiting successes and the slots, so a flag still
        set means it has yet to read what the caller changed before asking.
        (``Event.set`` takes a Condition's lock and notifies, every time: once
        per job, for a flag most jobs of a wave find already set.)"""
        if not self.wakeup.is_set():
            self.wakeup.set()

    def take(self) -> list[RunningJob]:
        """The successes waiting now, at most ``COMPLETION_BATCH``, each marked
        as in a wave; one withdrawn meanwhile (``withdraw``) is skipped."""
        batch: list[RunningJob] = []
        with self.taking:
            while len(batch) < COMPLETION_BATCH:
                try:
                    running = self.waiting.get_nowait()
                except queue.Empty:
                    break
                if not running.withdrawn:
                    running.in_wave = True
                    batch.append(running)
        return batch

    def withdraw(self, running: RunningJob) -> bool:
        """Take a waiting success back to write it one by one (the asyncio
        watchdog, when no wave came for about a lease); False once a wave
        has it, which then settles it, or has it write its own if it fails.

        Never both: were a success written by the watchdog and by a wave,
        whichever wrote second would find the job finished and report it
        lost, and ``task_finished`` would not be sent.
        """
        with self.taking:
            if running.in_wave:
                return False
            running.withdrawn = True
            return True

    def write_wave(
        self,
        batch: list[RunningJob],
        claim: Callable[[int], list[store.ClaimedJob]],
        limit: int,
        fused: Callable[[int], WaveClaim | None] | None = None,
    ) -> list[store.ClaimedJob]:
        """Write ``batch`` and ``claim`` up to ``limit`` jobs, in one transaction.

        The claim sees the slots the wave frees, and both commit together:
        a crash between them cannot leave a job written but its slot still
        counted, nor a claim made for slots that were never freed. If the
        transaction fails, each job of the wave writes its own (``abort``).
        Returns the claimed jobs, for the producer to start.

        ``fused(limit)``: the claim as one statement with the successes
        (``store.wave``: one round trip, partitions included), or None when
        this wave needs the transaction (a placement, queue limits, a
        concurrency group waiting).
        """
        if fused is not None:
            try:
                # Planning reads the flow state, the control connection's
                # next statement: a cut connection fails it, and the taken
                # successes must then write their own, or their slots are
                # kept for good (a stop, ``--burst``, waits on them forever).
                spec = fused(limit)
            except BaseException:
                self.abort(batch)
                raise
            if spec is not None:
                return self.write_fused(batch, claim, spec)
        self.passed = 0
        for running in batch:  # a map child's success left to the wave: written first
            mapwave.flush(self.db, running.claimed.id, running.claimed.lease.epoch)
        try:
            with transaction.atomic(using=self.db):
                won = self.write(batch, self.db)
                claimed = claim(limit) if limit > 0 else []
        except BaseException:
            self.abort(batch)
            raise
        if self.slots is not None:
            self.slots.drop_written(batch)
        self.settle(batch, won)
        return claimed

    def write_fused(
        self,
        batch: list[RunningJob],
        claim: Callable[[int], list[store.ClaimedJob]],
        spec: WaveClaim,
    ) -> list[store.ClaimedJob]:
        """``write_wave`` as one statement (``store.wave``): the successes, the
        promotions of the keys they free and the claim commit together. When
        the statement passed candidates by or demoted some (they wait behind
        their partition's head), the gates claim for the slots still free, in
        a transaction of their own (``claim``: it reads on past what it sets
        aside); ``passed``, the jobs of concurrency groups it passed by, tells
        the producer to claim through the gates for a while."""
        try:
            results, usage = self.fused_values(batch)
            wave = jobs_finish_many_and_claim(results, db=self.db, claim=spec, usage=usage)
        except BaseException:
            self.abort(batch)
            raise
        # Committed: from here on nothing may abort the wave, and what it
        # leased must start whatever fails below.
        claimed = wave.claimed
        self.follow_up(wave.after)
        try:
            if self.slots is not None:
                self.slots.drop_written(batch)
            self.settle(batch, wave.won)
            wave_promote_freed(wave, db=self.db)
        except Exception:
            logger.warning("a wave committed, but settling its jobs or promoting the "
                           "partitions they freed failed (the leader's sweep promotes "
                           "stalled partitions)", exc_info=True)  # fmt: skip
        self.passed = wave.grouped
        free = spec.limit - len(claimed)
        if (wave.passed or wave.demoted) and free > 0:
            try:
                with transaction.atomic(using=self.db):
                    claimed += claim(free)
            except Exception:
                logger.warning("claiming keyed jobs failed; will retry", exc_info=True)
        return claimed

    @staticmethod
    def wave_values(
        batch: list[RunningJob],
    ) -> tuple[list[tuple[store.Lease, Any]], dict[int, UsageEntry] | None]:
        """The wave's (lease, return value) pairs, and the usage records by job id
        when successes are recorded."""
        results = [(r.claimed.lease, r.finished.return_value) for r in batch if r.finished]
        usage = None
        if usage_recorded("succeeded"):
            usage = {
                r.claimed.id: metering.entry(r.claimed, "succeeded") for r in batch if r.finished
            }
        return results, usage

    @staticmethod
    def fused_values(
        batch: list[RunningJob],
    ) -> tuple[list[tuple[store.Lease, Any]], dict[int, UsageEntry | Measured] | None]:
        """``wave_values`` for the one-statement wave, whose records take from the
        worker only what it measured (``store.finish.Measured``): read from the
        meter each success carries, without the ``UsageEntry`` of 13 fields."""
        results = [(r.claimed.lease, r.finished.return_value) for r in batch if r.finished]
        if not usage_recorded("succeeded"):
            return results, None
        usage: dict[int, UsageEntry | Measured] = {}
        for r in batch:
            if r.finished is None:
                continue
            if r.meter is None:  # not handed over by a job thread: look it up
                usage[r.claimed.id] = metering.entry(r.claimed, "succeeded")
            else:
                wall, cpu, rss = r.meter.reading()
                usage[r.claimed.id] = Measured(wall, cpu, rss, metering.HOST, "succeeded")
        return results, usage

    @staticmethod
    def write(batch: list[RunningJob], db: str) -> set[int]:
        """Inside the caller's transaction: the ids whose fenced write won.

        The winners' usage records go with it: every job's is handed over,
        the store writes only those whose fenced write won (on PostgreSQL in
        the same statement: one round trip per wave).
        """
        if not batch:
            return set()
        results, usage = BatchCompleter.wave_values(batch)
        return set(store.jobs_finish_many_if_leased(results, db=db, usage=usage))

    def follow_up(self, actions: list[Callable[[], None]]) -> None:
        """Right after a wave's commit, before what may fail: its map counts."""
        if self.followups is not None:
            return self.followups.put(actions)
        for action in actions:
            run(action)

    @staticmethod
    def settle(batch: list[RunningJob], won: set[int]) -> None:
        """After the commit: wake each job with its result."""
        for running in batch:
            running.won = running.claimed.id in won
            running.mark_persisted()

    @staticmethod
    def abort(batch: list[RunningJob]) -> None:
        """The wave's transaction failed: each job writes its own outcome."""
        for running in batch:
            running.won = None
            running.mark_persisted()

    @staticmethod
    def after_wave(running: RunningJob, outcome: Outcome) -> bool:
        """Once the wave is written: report it and send ``task_finished`` (user code).

        False when the wave failed: the caller writes the outcome itself.
        """
        if running.won is None:
            return False
        if running.won:
            joblog.finished(running.claimed, "succeeded")
            signal_finished(outcome)
        else:
            joblog.finished(running.claimed, "lost", detail="its succeeded")
            # If it was cancelled, let go of it (which frees its partition).
            store.job_ack_cancelled(
                running.claimed.lease, partition_key=running.claimed.row["partition_key"]
            )
        return True

    def report(self, running: RunningJob) -> None:
        """On the reporter's thread: ``after_wave``, or ``persist`` if the wave failed;
        then drop the attempt's meter (the wave wrote its usage record from it)."""
        outcome = running.finished
        assert outcome is not None
        try:
            if not self.after_wave(running, outcome):  # the wave failed
                try:
                    persist(
                        running.claimed,
                        outcome,
                        give_up_after=self.wait_seconds,
                        report=not running.abandoned,
                    )
                finally:
                    self.give_slot_back(running)
        finally:
            metering.forget(running.claimed.id, running.meter)

    def give_slot_back(self, running: RunningJob) -> None:
        """A success whose wave failed, once it wrote its own outcome (or gave up).

        Its slot goes: otherwise the heartbeat renews the lease of a job
        already written (or, if its write gave up, one that must be reclaimed
        and now never is), a stopping worker waits on it until its deadline,
        and ``--burst`` never ends.
        """
        if self.slots is not None:
            self.slots.drop_written([running])
        self.wake()  # the control loop: a slot is free

    def coalesce(self, running: int) -> None:
        """Let a wave of finishing jobs gather before writing it.

        Short jobs finish within microseconds of each other; waiting up to
        ``COALESCE_SECONDS`` for the rest of the wave (until as many are
        waiting as ``running`` jobs) turns many one-row completions, each a
        transaction and a claim, into one.
        """
        if self.waiting.empty():
            return
        deadline = time.monotonic() + COALESCE_SECONDS
        while self.waiting.qsize() < running and time.monotonic() < deadline:
            time.sleep(COALESCE_SECONDS / 8)
