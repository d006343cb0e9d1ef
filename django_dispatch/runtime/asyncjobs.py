"""The asyncio executor: many ``async def`` jobs of one process on one event loop.

``rundispatch --async-concurrency N`` gives a worker process N slots on an event
loop of its own (a thread, ``dispatch-async``), beside its job threads. A claimed
job whose task is a coroutine function runs there; any other job runs on a job
thread. Without the flag an async task takes a whole thread and a fresh event loop
per attempt (``attempt.execute``), so a process runs ``--concurrency`` I/O-bound
jobs at once; with it, hundreds.

What stays the same as on a job thread, because the steps are the job runner's own
(``jobthreads.JobRunner``): the connection check before task code, the lease (the
control loop renews it), timeouts and cancellation (the coroutine's asyncio task
is cancelled), the usage record, the fenced write of the outcome, successes
written in the control loop's completion wave.
Per job the loop pays one task, started eagerly, and a share of one hop to the
sync thread (``AsyncJobs`` says how the rest is done once per claim and per wave).

Database connections stay bounded: everything synchronous around a job (the
connection check, ``task_started`` and ``task_finished`` receivers, which are user
code, a write the wave did not take) runs through asgiref's
``sync_to_async(thread_sensitive=True)``, on the one thread where the task's own
ORM calls (``await Model.objects.acreate(...)``, ``sync_to_async``) run too. So the
executor adds one connection to the process, however many jobs it runs. The event
loop itself never touches the database.

Task code that blocks the event loop (a synchronous sleep, a CPU-bound loop) stalls
every job on it; timeouts still end it (the control loop watches the clock), but
such tasks belong on threads: define them with ``def``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Coroutine
from functools import partial
from typing import Any, Literal

from django.db import connections

from .. import store
from ..observability import joblog, tracing
from . import attempt, metering
from .connections import ThreadConnections, reset_connections
from .executor import Outcome
from .jobthreads import JobRunner
from .running import RunningJob
from .synchops import SyncHops, run_steps, sync

logger = logging.getLogger("django_dispatch.worker")

After = Literal["write", "wave", "done"]


class AsyncJobs:
    """An event loop on a thread of its own, running the async jobs the control loop hands it.

    A claim's jobs take their steps before task code in one hop (``_start``),
    then each gets a task started eagerly: it runs at once up to its first
    wait, with no future, wake-up or loop turn of its own before. A job's
    coroutine ends once its success is offered to the completion wave, whose
    commit settles the whole wave in one wake-up of the loop (``_settle``):
    a success nothing observes (no ``task_finished`` receiver, its write
    won) ends there without a hop to the sync thread. No job has a timer:
    one watchdog (``_overdue``) looks after the successes awaiting a wave.
    """

    def __init__(self, runner: JobRunner) -> None:
        self.runner = runner
        self.loop = asyncio.new_event_loop()
        #: The connection bookkeeping of the sync thread (used only there).
        self.conns = ThreadConnections()
        #: The jobs on the loop, by their asyncio task (and the hops that end them).
        self.tasks: dict[asyncio.Task[None], RunningJob] = {}
        #: Claims whose jobs' steps before task code are in a hop (``_start``):
        #: registered, no task of their own yet.
        self.starting: dict[asyncio.Task[None], list[RunningJob]] = {}
        self.hops = SyncHops(self.loop)
        #: The hop (``SyncHops.count``) whose steps found the connections usable.
        self.checked_hop = -1
        #: Whether each signal sender's ``task_started``/``task_finished`` are
        #: observed (``attempt.prepare``), while no user code ran in this hop.
        self.silence: dict[Any, tuple[bool, bool]] = {}
        #: The signals' receiver counts ``silence`` was kept for.
        self.receivers = attempt.signal_receivers()
        #: Successes offered to the wave by ``id(running)``: (job, loop time), oldest first.
        self.offered: dict[int, tuple[RunningJob, float]] = {}
        self.watchdog: asyncio.TimerHandle | None = None
        #: Successes a wave wrote (or failed to), appended by the control loop.
        self.settled: deque[RunningJob] = deque()
        self.settle_scheduled = False
        #: Jobs ended without the sync thread: reset its connections before the next one.
        self.reset_due = False
        self.thread = threading.Thread(
            target=store.carrying_database(self._main), name="dispatch-async", daemon=True
        )
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(sync(connections.close_all))
            self.loop.close()

    def submit(self, jobs: list[RunningJob]) -> None:
        """From the control loop: start a claim's async jobs on the event loop (one wake-up)."""
        for running in jobs:
            running.on_loop = True
        self.loop.call_soon_threadsafe(self._spawn, jobs)

    def _spawn(self, jobs: list[RunningJob]) -> None:
        # Registered here, in the loop's thread (timeouts find them started),
        # all at once: a job handed back meanwhile gets no task, as on a thread.
        started = self.runner.register_many(jobs)
        if started:
            task = self.loop.create_task(self._start(started))
            self.starting[task] = started
            task.add_done_callback(self.starting.pop)

    async def _start(self, jobs: list[RunningJob]) -> None:
        """The claim's steps before task code in one hop (``_before``), then a
        task per job, started eagerly. Cancelled in the hop (a stop handing
        the jobs back), each job ends as its own cancelled task would."""
        try:
            befores = await self.hops.run(run_steps, [partial(self._before, r) for r in jobs])
        except asyncio.CancelledError:
            for running in jobs:
                self._track(self._end(running, None, None, "write"), running)
            raise
        except Exception as e:  # the hop itself failed: each job as if its step had
            befores = [(False, e)] * len(jobs)
        loop = self.loop
        for running, before in zip(jobs, befores, strict=True):
            name = f"job-{running.claimed.lease.job_id}"
            task = asyncio.Task(self._run(running, before), loop=loop, name=name, eager_start=True)
            if not task.done():  # one that ended eagerly has already forgotten itself
                self.tasks[task] = running

    def stop(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` for jobs still on the loop, then stop it.

        After a hand-back (``timeout`` 0) the jobs left are back in the queue
        already: they are cancelled, and whatever they return is dropped by
        the fence.
        """
        if self.loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._drain(timeout), self.loop).result(timeout + 5)
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5.0)

    async def _drain(self, timeout: float) -> None:
        # A claim whose steps were in a hop starts its jobs' tasks meanwhile:
        # wait for those too, within the same deadline.
        deadline = self.loop.time() + timeout
        while (left := deadline - self.loop.time()) > 0:
            if not (alive := {t for t in (*self.tasks, *self.starting) if not t.done()}):
                break
            await asyncio.wait(alive, timeout=left)
        for done in [t for t in self.tasks if t.done()]:
            del self.tasks[done]
        for task, jobs in list(self.starting.items()):
            for running in jobs:  # handed back: none of them may start its task code
                running.abandoned = True
                running.cancel_event.set()
            task.cancel()
        for task, running in list(self.tasks.items()):
            # Handed back, or left to a recycled process's successor to settle:
            # whatever the job does now must not be written as its outcome.
            running.abandoned = True
            running.cancel_event.set()
            task.cancel()
        if self.tasks or self.starting:
            await asyncio.wait(set(self.tasks) | set(self.starting), timeout=1.0)
        if self.tasks:  # the ends of jobs whose claim was cancelled in its hop
            await asyncio.wait(set(self.tasks), timeout=1.0)
        # Successes offered after the last wave: no wave will write them now.
        late = [
            self._finish(r, r.finished, "write") for r, _ in self.offered.values() if r.finished
        ]
        self.offered.clear()
        if late:
            await asyncio.wait(late, timeout=5.0)

    async def _run(self, running: RunningJob, before: tuple[bool, Any]) -> None:
        """One job: the job runner's steps, task code awaited here, the
        synchronous steps before it (``before``: what ``_before`` returned or
        raised, in its claim's hop); a success ends in the wave (``_offer``),
        anything else in ``_after``."""
        runner = self.runner
        outcome: Outcome | None = None
        meter: metering.Meter | None = None
        #: What ``_after`` does with the outcome: "write" it, or nothing
        #: ("done": already written); "wave": the wave settles it (``_settle``).
        then: After = "write"
        try:
            ok, value = before
            if not ok:
                raise value
            meter, prepared = value
            if meter is None:
                outcome, then = Outcome(kind="released"), "done"  # ``begin`` wrote it
                return
            if tracing.AVAILABLE and tracing.active():
                with tracing.consumer(running.claimed) as span:
                    outcome = await self._attempt(running, prepared)
                    tracing.outcome(span, outcome.kind, outcome.exception)
            else:
                outcome = await self._attempt(running, prepared)
            runner.ran(running, meter)
            if self._offer(running, outcome, meter):
                then = "wave"
        except Exception as e:
            self.checked_hop = -1  # whatever failed may have been the connection
            outcome, then = await self.hops.run(runner.unexpected, running, e), "done"
        finally:
            try:
                if then != "wave":
                    await self._end(running, outcome, meter, then)
            finally:
                self._forget(asyncio.current_task())

    def _before(
        self, running: RunningJob
    ) -> tuple[metering.Meter | None, Outcome | attempt.Prepared | None]:
        """On the sync thread: ``JobRunner.begin``, then ``attempt.prepare``."""
        if self.reset_due:  # jobs that ended on the loop (``_settle``) left them as they were
            self.reset_due = False
            reset_connections()
        # The connections are checked once per hop: between two steps of one hop
        # no task code runs on this thread, only these steps, whose one piece of
        # user code (``task_started`` receivers) makes the next job check again.
        hop = self.hops.count
        receivers = attempt.signal_receivers()
        if self.checked_hop != hop or receivers != self.receivers:
            # A new hop (task code ran on the loop since), user code ran in
            # this one, or a task module imported here (``attempt.resolve``)
            # connected a receiver: the signals' observers may have changed.
            self.silence.clear()
            self.receivers = receivers
        meter = self.runner.begin(running, self.conns, check=self.checked_hop != hop)
        if meter is None:
            return None, None
        self.checked_hop = hop
        self.runner.overseer.started(running)
        prepared = attempt.prepare(running.claimed, running, silence=self.silence)
        if isinstance(prepared, attempt.Prepared) and prepared.started_sent:
            self.checked_hop = -1
        return meter, prepared

    def _after(
        self,
        running: RunningJob,
        outcome: Outcome | None,
        meter: metering.Meter | None,
        then: After,
    ) -> None:
        """On the sync thread: report a success the wave wrote, or write the
        outcome one by one (also when the wave failed); then ``JobRunner.end``."""
        # task_finished receivers (user code), the writes and the end's reset of a
        # broken connection run here: the next job's step checks the connections again.
        self.checked_hop = -1
        try:
            if outcome is None or then == "done":
                pass
            elif then == "write" or not self.runner.completer.after_wave(running, outcome):
                self.runner.write(running, outcome)
        finally:
            self.runner.end(running, outcome, meter, self.conns)

    async def _attempt(
        self, running: RunningJob, prepared: Outcome | attempt.Prepared | None
    ) -> Outcome:
        """``JobRunner._attempt`` with the task awaited on this loop."""
        claimed = running.claimed
        assert prepared is not None
        if isinstance(prepared, Outcome):
            outcome = prepared
        else:
            try:
                value = await attempt.run_untimed(prepared, running)
            except BaseException as e:
                # ``conclude`` may look at the connection that broke under the task:
                # that is the sync thread's.
                outcome = await self.hops.run(
                    partial(attempt.conclude, claimed, running, prepared, error=e)
                )
            else:
                outcome = attempt.conclude(claimed, running, prepared, value=value)
        return self.runner.finish_attempt(running, outcome)

    # --- the completion wave ------------------------------------------------

    def _offer(self, running: RunningJob, outcome: Outcome, meter: metering.Meter) -> bool:
        """A success joins the control loop's completion wave; the job's task ends.

        False when the outcome is not a success: ``_after`` writes it. The wave's
        commit settles it (``_settle``); if that takes longer than about a lease
        (the control loop is stuck), the watchdog writes it (``_overdue``), fenced.
        """
        if outcome.kind != "succeeded":
            return False
        running.meter = meter
        running.on_persisted = partial(self._persisted, running)
        self.offered[id(running)] = (running, self.loop.time())
        if not self.runner.completer.offer(running, outcome):
            del self.offered[id(running)]
            return False
        if self.watchdog is None:
            self.watchdog = self.loop.call_later(self.runner.completer.wait_seconds, self._overdue)
        return True

    def _persisted(self, running: RunningJob) -> None:
        """On the control loop, once the wave is written or failed: one wake-up
        of the event loop for the whole wave, not one per job."""
        self.settled.append(running)
        if not self.settle_scheduled:
            self.settle_scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to settle
                self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        """On the loop: end each job of the waves written since the last call.

        A won success nothing observes ends here; the others (``task_finished`` to
        send, a lost write, a failed wave) take a hop to the sync thread (``_after``).
        """
        self.settle_scheduled = False  # before reading: a later append schedules again
        quiet: list[RunningJob] = []
        while self.settled:
            running = self.settled.popleft()
            if self.offered.pop(id(running), None) is None:
                continue  # the watchdog gave up on its wave: ``_after`` wrote it
            outcome = running.finished
            assert outcome is not None
            if running.won and outcome.task_result is None:
                joblog.finished(running.claimed, "succeeded")
                quiet.append(running)
            else:
                self._finish(running, outcome, "wave")
        if quiet:
            self._end_quietly(quiet)

    def _end_quietly(self, jobs: list[RunningJob]) -> None:
        """``JobRunner.end`` of successes the wave wrote, without the sync thread:
        its connections are reset before the next job's code (``_before``)."""
        metering.forget_many([(running.claimed.id, running.meter) for running in jobs])
        slots = self.runner.slots
        with slots.lock:
            for running in jobs:
                job_id = running.claimed.id
                slots.threads.pop(job_id, None)
                slots.lingering.pop(job_id, None)
        self.reset_due = True
        self.conns.done()  # read by ``ready_for_task``: the thread is busy, not idle

    def _overdue(self) -> None:
        """The watchdog: successes no wave took within about a lease are written one
        by one, oldest first; those a wave took are its own (``BatchCompleter.withdraw``)."""
        self.watchdog, completer, now = None, self.runner.completer, self.loop.time()
        wait = completer.wait_seconds
        for key, (running, offered_at) in list(self.offered.items()):
            if now - offered_at < wait:  # the oldest first: the rest are younger
                self.watchdog = self.loop.call_later(offered_at + wait - now, self._overdue)
                return
            if not completer.withdraw(running):
                continue
            del self.offered[key]
            assert running.finished is not None
            self._finish(running, running.finished, "write")

    def _finish(self, running: RunningJob, outcome: Outcome, then: After) -> asyncio.Task[None]:
        """``_after`` in a task of its own, which ``stop`` waits for like a job."""
        return self._track(self._end(running, outcome, running.meter, then), running)

    def _track(self, end: Coroutine[Any, Any, None], running: RunningJob) -> asyncio.Task[None]:
        task = self.loop.create_task(end)
        self.tasks[task] = running
        task.add_done_callback(self._forget)
        return task

    async def _end(
        self, running: RunningJob, outcome: Outcome | None, meter: Any, then: After
    ) -> None:
        with contextlib.suppress(Exception):
            await self.hops.run(self._after, running, outcome, meter, then)

    def _forget(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self.tasks.pop(task, None)
