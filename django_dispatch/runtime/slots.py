"""The jobs a worker process holds, shared by its control loop and its job threads.

One lock guards them all: the table of running jobs, the thread running
each, and the jobs given up on whose code still runs. The producer asks how
many jobs the next claim may take (``free``) and what it may place
(``placement``); the job threads and the completer take jobs out as they
end.
"""

from __future__ import annotations

import threading
import time

from ..core.resources import minus
from ..store.sources.shapes import SHAPES_TTL, ShapeCache
from ..store.types import Placement
from .running import RunningJob

#: While every recent job ran shorter than this, jobs are claimed ahead of free threads.
PREFETCH_JOB_SECONDS = 0.05
#: How many jobs per thread a worker claims ahead (on PostgreSQL). A wave is one
#: statement whose server cost is mostly fixed (about 0.57 ms, and 0.035 ms per
#: job), and it carries what the worker holds: claiming further ahead makes the
#: waves bigger and each job's share smaller. Three gained little over two, and
#: each step lets a dead worker's lease hold more jobs.
PREFETCH_FACTOR = 2
#: The most successes one completion wave writes (``completer.take``); on
#: SQLite, whose ORM write fences them with one OR term each, and refuses an
#: expression tree deeper than 1,000.
COMPLETION_BATCH = 200
#: The most one wave writes on PostgreSQL (``Producer.take_wave``: several
#: ``take``), one statement whatever its size. Hundreds of async slots end at
#: once, and a success a wave leaves behind holds its slot (``Slots.free``)
#: for another round trip: waves of 200 bounded a process with 1,000 async
#: slots well under its slots' rate.
PG_WAVE = 1000
#: How fast a long job is forgotten: the slowest recent run shrinks by this
#: factor per job that ends (a 1 s job stops claiming ahead for ~300 jobs).
SLOWEST_DECAY = 0.99


class Slots:
    """The jobs a worker process holds, shared by its control loop and its job threads."""

    def __init__(self, concurrency: int, async_concurrency: int = 0, prefetch: int = 0) -> None:
        self.concurrency = concurrency
        #: Jobs claimed ahead of free threads while jobs are short (see ``free``).
        self.prefetch = prefetch
        #: The slowest recent run of a task here, decaying (see ``ran``); None
        #: before the first.
        self.job_seconds: float | None = None
        #: Set once the worker stops claiming: nothing more is claimed ahead.
        self.stopping = False
        #: Whether the last claim took all it asked for: jobs are likely left
        #: in the queue, and the next claim brings more soon.
        self.backlog = False
        #: Whether jobs claimed ahead wait for a thread (``behind_long_jobs``):
        #: the control loop then looks again within ``PREFETCH_JOB_SECONDS``.
        self.holding_ahead = False
        #: Slots of the asyncio executor (``rundispatch --async-concurrency``).
        self.async_concurrency = async_concurrency
        #: Share of async jobs in the last claim: how much of the event
        #: loop's free room the next claim asks for (see ``free``).
        self.async_share = 0.25
        self.lock = threading.Lock()
        self.running: dict[int, RunningJob] = {}
        #: The thread running each job, once one picked it up.
        self.threads: dict[int, threading.Thread] = {}
        #: The shapes of jobs with needs pending, as last read (see ``placement``).
        self.shapes = ShapeCache(SHAPES_TTL)
        #: Jobs given up on whose task code still runs on a retired thread:
        #: no slot, but they still hold their resources until they return.
        self.lingering: dict[int, RunningJob] = {}

    def free(self) -> int:
        """How many jobs the next claim may take.

        A success the wave being written has taken (``BatchCompleter.take``)
        holds no slot: its thread has gone on (``BatchCompleter.hand_over``),
        and the claim commits with its write. Nor does an atomic success
        waiting for its own commit. A success queued for a later wave still
        holds its slot (``RunningJob.awaits_wave``): a wave writes at most
        ``COMPLETION_BATCH`` of them, and with hundreds of async slots ending
        faster than the waves write, counting those free would let the claims
        lease without bound (thousands of jobs leased and unstarted, which sit
        out their lease if the worker dies, while other workers starve). So a
        worker never holds more leased jobs than its slots and the jobs
        claimed ahead.

        With an asyncio executor, a claim cannot ask for async jobs only: it
        learns which task a job runs once it has it. It asks for the free
        threads plus the share of the event loop's free room that async jobs
        took in the last claim (at least one, to notice a change), and for
        nothing while sync jobs wait for a thread. So jobs sit claimed and
        unstarted (leased, renewed, handed back at shutdown) only briefly,
        and a queue of sync jobs is not hoarded by a worker that has 200
        async slots and 8 threads. Async jobs that a claim for free threads
        brought in past the loop's slots take those threads' room: the
        loop's slots plus the threads bound what a worker holds.
        """
        threads = self.concurrency + self.ahead()
        with self.lock:
            held = on_loop = 0
            for running in self.running.values():
                if running.finished is None or running.awaits_wave:
                    held += 1
                    on_loop += running.on_loop
            if not self.async_concurrency:
                return max(0, threads - held)
            # Async jobs past the loop's slots came in for free threads (a
            # claim learns what it took only once it has it): they take those
            # threads' room, or a claim per turn would add more without bound.
            loop_free = self.async_concurrency - on_loop
            threads_free = threads - (held - on_loop) + min(0, loop_free)
            if threads_free < 0 or loop_free <= 0:
                return max(0, threads_free)
            return threads_free + max(1, round(loop_free * self.async_share))

    def ahead(self) -> int:
        """How many jobs to hold claimed beyond the threads, ready for the next free one.

        A thread that finishes a short job takes the next at once instead of
        waiting a round trip for the claim that refills its slot; that wave's
        claim then refills the buffer. Only while every recent job was short:
        a long job claimed ahead would sit leased and unstarted behind a
        running one while another worker could run it. So the measure is the
        slowest recent job, not an average that a queue of short jobs would
        keep low while a long one hides in it. Never before the first job's
        length is known, nor once the worker stops.
        """
        seconds = self.job_seconds
        if self.stopping or seconds is None or seconds >= PREFETCH_JOB_SECONDS:
            return 0
        return self.prefetch

    def ran(self, seconds: float) -> None:
        """A task ran ``seconds`` (any thread; a lost update is harmless).

        The slowest recent run, decaying by ``SLOWEST_DECAY`` per job: one
        long job stops the claims ahead at once, and only a few hundred short
        ones bring them back.
        """
        old = self.job_seconds
        self.job_seconds = seconds if old is None else max(seconds, old * SLOWEST_DECAY)

    def behind_long_jobs(self) -> list[RunningJob]:
        """The jobs claimed ahead that now wait behind long jobs, taken out of
        the slots and marked abandoned for the caller to hand back.

        The slowest recent job cannot foresee a task that has not run here
        yet: a worker that knew only short jobs may claim a long one ahead,
        or claim short ones ahead of a long one now running. Both would sit
        leased and unstarted while another worker could run them. So a thread
        job still running past ``PREFETCH_JOB_SECONDS`` counts as a long run
        (``ran``: nothing more is claimed ahead), and the jobs held beyond the
        share of the threads not running a long job go back to the queue at
        once, without spending an attempt (the newest first: the threads take
        the oldest next). Each such thread, idle or on a short job, keeps its
        share of what the worker holds (one job and ``prefetch / concurrency``
        ahead), so a held job waits no longer than with no long job running;
        once every thread runs a long job, every held job goes back. On a busy
        machine a short job often passes the mark for a moment: handing every
        held job back each time would cost a fenced write and a claim again
        per job, more than the jobs themselves.

        Not with an asyncio executor: there, sync jobs claimed through the
        event loop's share may wait for a thread by design (see ``free``,
        which bounds them); handing them back would only have the next claim
        take them again.
        """
        if self.async_concurrency or not self.prefetch:
            return []  # nothing is ever held ahead of the threads
        now = time.monotonic()
        with self.lock:
            unstarted: list[RunningJob] = []
            busy = held_long = 0
            longest = 0.0
            for running in self.running.values():
                if running.on_loop or running.finished is not None:
                    continue
                if running.begun_at is None:
                    unstarted.append(running)
                else:
                    busy += 1
                    seconds = now - running.begun_at
                    held_long += seconds >= PREFETCH_JOB_SECONDS
                    longest = max(longest, seconds)
            excess = len(unstarted) - max(0, self.concurrency - busy)
            self.holding_ahead = excess > 0
            if longest < PREFETCH_JOB_SECONDS:
                return []  # they wait behind short jobs: a thread takes them soon
            self.ran(longest)
            free_threads = max(0, self.concurrency - held_long)
            share = free_threads * (self.concurrency + self.prefetch) // self.concurrency
            stranded = len(unstarted) - max(0, share - (busy - held_long))
            if stranded <= 0:
                return []
            self.holding_ahead = excess - stranded > 0
            return self._abandon(unstarted[-stranded:])

    def take_unstarted(self) -> list[RunningJob]:
        """At a stop: every thread job no thread has started (claimed ahead),
        taken out of the slots and marked abandoned for the caller to hand back."""
        with self.lock:
            return self._abandon(
                [
                    running
                    for running in self.running.values()
                    if running.begun_at is None and running.finished is None and not running.on_loop
                ]
            )

    def _abandon(self, unstarted: list[RunningJob]) -> list[RunningJob]:
        """Under ``lock``: take jobs no thread started out of the slots. A thread
        that picks one up afterwards skips it (``JobRunner.register``)."""
        for running in unstarted:
            running.abandoned = True
            del self.running[running.claimed.id]
        return unstarted

    def drop_written(self, wave: list[RunningJob]) -> None:
        """After a wave's commit: its jobs are written, they hold nothing any more.

        Only the entry of that very attempt: a job lost meanwhile and claimed
        again here is another entry, and keeps its slot.
        """
        with self.lock:
            for running in wave:
                if self.running.get(running.claimed.id) is running:
                    del self.running[running.claimed.id]

    def learn(self, on_loop: int, claimed: int) -> None:
        """After a claim of ``claimed`` jobs, ``on_loop`` of them async."""
        if claimed:
            self.async_share = on_loop / claimed

    def placement(
        self, capacity: dict[str, int], locality: str, starvation_seconds: float
    ) -> Placement | None:
        """What the next claim may take: None without capacity or locality (the
        claim then ignores resource needs); else the capacity less what running
        jobs hold. Jobs whose success waits in the completion wave hold nothing:
        the claim that writes their wave frees their slots too."""
        if not capacity and not locality:
            return None
        held: dict[str, int] = {}
        with self.lock:
            for running in [*self.running.values(), *self.lingering.values()]:
                if running.finished is None:
                    held = minus(held, running.claimed.row.get("resources"))
        return Placement(
            capacity=capacity,
            locality=locality or None,
            held={name: -amount for name, amount in held.items()},
            starvation_seconds=starvation_seconds,
            cache=self.shapes,
        )
