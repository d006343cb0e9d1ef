"""The synchronous steps of the asyncio executor's jobs, run on one thread in hops.

The event loop never touches the database: what a job does synchronously
(the connection check, ``task_started`` and ``task_finished`` receivers,
which are user code, a write the wave did not take) runs through asgiref's
``sync_to_async(thread_sensitive=True)``, on the thread that also serves the
tasks' own ORM calls (``asyncjobs``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async


async def sync[T](func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``func`` on the thread that also serves the tasks' own ORM calls."""
    return await sync_to_async(func, thread_sensitive=True)(*args, **kwargs)


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
        #: Hops made so far: the one running now, read by its steps on the sync thread.
        self.count = 0

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
                self.count += 1
                try:
                    results = await sync(run_steps, [step for step, _ in steps])
                except BaseException as e:
                    # The hop itself failed (the sync thread's executor gone,
                    # this task cancelled): every step's waiter learns it, or
                    # its job would wait for ever, leased and counted running.
                    for _, future in steps:
                        if not future.done():
                            future.set_exception(RuntimeError(f"the sync hop failed: {e!r}"))
                    raise
                for (_, future), (ok, value) in zip(steps, results, strict=True):
                    if future.done():  # its job was cancelled meanwhile
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        finally:
            self.flushing = False


def run_steps(steps: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    """Each step on its own: (True, its value) or (False, what it raised)."""
    results: list[tuple[bool, Any]] = []
    for step in steps:
        try:
            results.append((True, step()))
        except BaseException as e:  # the job's own failure, not the hop's
            results.append((False, e))
    return results
