"""The asyncio executor: many ``async def`` jobs of one process on one event loop.

``rundispatch --async-concurrency N`` gives a worker process N slots on an
event loop of its own (a thread, ``dispatch-async``), beside its job threads.
A claimed job whose task is a coroutine function runs there; any other job
runs on a job thread. Without the flag an async task takes a whole
thread and a fresh event loop per attempt (``attempt.execute``), so a
process runs ``--concurrency`` I/O-bound jobs at once; with it, hundreds.

What stays the same as on a job thread, because the steps are the job
runner's own (``jobthreads.JobRunner``): the connection check before task
code, the lease (the control loop renews it), timeouts and cancellation (the
coroutine's asyncio task is cancelled), the usage record, the fenced write
of the outcome, successes written in the control loop's completion wave.

Database connections stay bounded: everything synchronous around a job (the
connection check, ``task_started`` and ``task_finished`` receivers, which
are user code, a write the wave did not take) runs through asgiref's
``sync_to_async(thread_sensitive=True)``, on the one thread where the task's
own ORM calls (``await Model.objects.acreate(...)``, ``sync_to_async``) run
too. So the executor adds one connection to the process, however many jobs
it runs. The event loop itself never touches the database.

Task code that blocks the event loop (a synchronous sleep, a CPU-bound loop)
stalls every job on it; timeouts still end it (the control loop watches the
clock), but such tasks belong on threads: define them with ``def``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

from asgiref.sync import sync_to_async
from django.db import connections

from .. import store
from ..observability import tracing
from . import attempt, metering
from .connections import ThreadConnections
from .executor import Outcome
from .jobthreads import JobRunner
from .running import RunningJob

logger = logging.getLogger("django_dispatch.worker")

After = Literal["write", "wave", "done"]


async def _sync[T](func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``func`` on the thread that also serves the tasks' own ORM calls."""
    return await sync_to_async(func, thread_sensitive=True)(*args, **kwargs)


class AsyncJobs:
    """An event loop on a thread of its own, running the async jobs the control loop hands it."""

    def __init__(self, runner: JobRunner) -> None:
        self.runner = runner
        self.loop = asyncio.new_event_loop()
        #: The connection bookkeeping of the sync thread (used only there).
        self.conns = ThreadConnections()
        #: The jobs on the loop, by their asyncio task.
        self.tasks: dict[asyncio.Task[None], RunningJob] = {}
        self.hops = SyncHops(self.loop)
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
                self.loop.run_until_complete(_sync(connections.close_all))
            self.loop.close()

    def submit(self, jobs: list[RunningJob]) -> None:
        """From the control loop: start a claim's async jobs on the event loop (one wake-up)."""
        for running in jobs:
            running.on_loop = True
        self.loop.call_soon_threadsafe(self._spawn, jobs)

    def _spawn(self, jobs: list[RunningJob]) -> None:
        for running in jobs:
            task = self.loop.create_task(self._run(running), name=f"job-{running.claimed.id}")
            self.tasks[task] = running
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self.tasks.pop(task, None)

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
        if self.tasks and timeout > 0:
            await asyncio.wait(set(self.tasks), timeout=timeout)
        if not self.tasks:
            return
        for task, running in list(self.tasks.items()):
            # Handed back, or left to a recycled process's successor to settle:
            # whatever the job does now must not be written as its outcome.
            running.abandoned = True
            running.cancel_event.set()
            task.cancel()
        await asyncio.wait(set(self.tasks), timeout=1.0)

    async def _run(self, running: RunningJob) -> None:
        """One job: the job runner's steps, task code awaited here, and the
        synchronous steps in two hops to the sync thread (``SyncHops``)."""
        runner = self.runner
        outcome: Outcome | None = None
        meter: metering.Meter | None = None
        #: What ``_after`` does with the outcome: "write" it, report the "wave"
        #: that wrote it, or nothing ("done": already written).
        then: After = "write"
        try:
            if not runner.register(running):  # in the loop's thread: timeouts find it started
                return
            meter, prepared = await self.hops.run(self._before, running)
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
            if await self._in_wave(running, outcome):
                then = "wave"
        except Exception as e:
            outcome, then = await self.hops.run(runner.unexpected, running, e), "done"
        finally:
            with contextlib.suppress(Exception):
                await self.hops.run(self._after, running, outcome, meter, then)

    def _before(
        self, running: RunningJob
    ) -> tuple[metering.Meter | None, Outcome | attempt.Prepared | None]:
        """On the sync thread: ``JobRunner.begin``, then ``attempt.prepare``."""
        meter = self.runner.begin(running, self.conns)
        if meter is None:
            return None, None
        self.runner.overseer.started(running)
        return meter, attempt.prepare(running.claimed, running)

    def _after(
        self,
        running: RunningJob,
        outcome: Outcome | None,
        meter: metering.Meter | None,
        then: After,
    ) -> None:
        """On the sync thread: report a success the wave wrote, or write the
        outcome one by one (also when the wave failed); then ``JobRunner.end``."""
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
                value = await attempt.run_async(
                    prepared.task, prepared.args, prepared.kwargs, prepared.timeout, running
                )
            except BaseException as e:
                # ``conclude`` may look at the connection that broke under the task:
                # that is the sync thread's.
                outcome = await self.hops.run(
                    partial(attempt.conclude, claimed, running, prepared, error=e)
                )
            else:
                outcome = attempt.conclude(claimed, running, prepared, value=value)
        return self.runner.finish_attempt(running, outcome)

    async def _in_wave(self, running: RunningJob, outcome: Outcome) -> bool:
        """A success joins the control loop's completion wave; await it without a thread.

        False when the outcome is not a success or the wave was not written
        within about a lease (the control loop is stuck): ``_after`` writes the
        outcome itself, fenced, as a job thread does (and when the wave failed).
        """
        written = self.loop.create_future()

        def persisted() -> None:  # on the control loop's thread
            self.loop.call_soon_threadsafe(_resolve, written)

        running.on_persisted = persisted
        if not self.runner.completer.offer(running, outcome):
            return False
        if running.persisted:
            _resolve(written)
        try:
            await asyncio.wait_for(written, timeout=self.runner.completer.wait_seconds)
        except TimeoutError:
            return False
        return True


class SyncHops:
    """The synchronous steps of many jobs, run together in one hop to the sync thread.

    Each hop through ``sync_to_async`` costs a thread switch and two wake-ups;
    with hundreds of jobs finishing at once, one hop per step per job would
    bound the executor. Steps asked for while a hop runs go together in the
    next one: the busier the loop, the more each hop carries. The steps run
    in order, each on its own: one that raises fails only its own job.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self.flushing = False

    async def run[T](self, func: Callable[..., T], *args: Any) -> T:
        future: asyncio.Future[T] = self.loop.create_future()
        self.pending.append((partial(func, *args), future))
        if not self.flushing:
            self.flushing = True
            self.loop.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self.pending:
                steps, self.pending = self.pending, []
                results = await _sync(_run_steps, [step for step, _ in steps])
                for (_, future), (ok, value) in zip(steps, results, strict=True):
                    if future.done():  # its job was cancelled meanwhile
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        finally:
            self.flushing = False


def _run_steps(steps: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    results: list[tuple[bool, Any]] = []
    for step in steps:
        try:
            results.append((True, step()))
        except BaseException as e:  # the job's own failure, not the hop's
            results.append((False, e))
    return results


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
