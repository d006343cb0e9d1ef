"""Tasks used by the test suite. Side effects go to real tables to be counted."""

import asyncio
import mmap
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from django_dispatch import task

from .models import Execution, SideEffect, Step


def quick_backoff(exception, task_result):
    """Retries after 50 ms, so that retry tests do not wait."""
    return 0.05


@task()
def add(a, b):
    return a + b


@task()
def noop(value=None):
    """Returns what it is given (None by default): batches of None results."""
    return value


@task(priority=5, queue_name="emails")
def echo(value):
    return value


@task()
def record(key):
    """Record one execution; unique key: a second run of the same job fails."""
    Execution.objects.create(key=key, worker_pid=os.getpid())
    return key


@task()
def record_many(key):
    SideEffect.objects.create(key=key, worker_pid=os.getpid(), note="ran")
    return key


@task()
def sleep_then_record(key, seconds):
    SideEffect.objects.create(
        key=key, worker_pid=os.getpid(), note="start", started_at=timezone.now()
    )
    time.sleep(seconds)
    SideEffect.objects.create(
        key=key, worker_pid=os.getpid(), note="end", finished_at=timezone.now()
    )
    return key


@task()
def fail_always(message="boom"):
    raise ValueError(message)


@task(max_attempts=3)
def fail_twice(key):
    """Fails on its first two attempts, succeeds on the third."""
    SideEffect.objects.create(key=key, note="attempt")
    if SideEffect.objects.filter(key=key, note="attempt").count() < 3:
        raise RuntimeError(f"attempt failed for {key}")
    return "third time lucky"


@task(max_attempts=2, backoff=lambda exc, result: 60.0)
def fails_then_backs_off_a_minute(key):
    """Fails every attempt; its retry waits a minute (longer than any test's drain)."""
    raise RuntimeError(f"attempt failed for {key}")


@task(max_attempts=2, backoff=lambda exc, result: None if isinstance(exc, KeyError) else 0.05)
def fail_not_retryable():
    raise KeyError("permanent")


@task(timeout=0.5)
def too_slow(seconds=3):
    time.sleep(seconds)
    SideEffect.objects.create(key="too_slow", note="finished after timeout")
    return "late"


@task(timeout=0.5)
async def too_slow_async(seconds=3):
    await asyncio.sleep(seconds)
    return "late"


@task()
async def async_add(a, b):
    await asyncio.sleep(0.01)
    return a + b


@task(takes_context=True)
def with_context(context, key):
    SideEffect.objects.create(
        key=key, job_id=context.task_result.id, note=f"attempt={context.attempt}"
    )
    return {"attempt": context.attempt, "id": context.task_result.id}


@task(takes_context=True)
def count_to(context, key, total, pause=0.0):
    """Processes items 1..total, saving progress after each; resumes from checkpoint."""
    start = (context.checkpoint or 0) + 1
    for item in range(start, total + 1):
        with transaction.atomic():
            SideEffect.objects.create(key=key, note=str(item), worker_pid=os.getpid())
        context.progress(item)
        time.sleep(pause)
    return total


@task()
def wait_for_file(key, path, max_seconds=30):
    """Runs until ``path`` exists: a job the test controls from outside."""
    SideEffect.objects.create(key=key, note="start", worker_pid=os.getpid())
    deadline = time.monotonic() + max_seconds
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    SideEffect.objects.create(key=key, note="end", worker_pid=os.getpid())
    return key


@task()
def cpu_bound(seconds):
    """Holds the GIL as much as pure Python can, for ``seconds``."""
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
    SideEffect.objects.create(key="cpu_bound", note=str(n > 0))
    return True


@task(max_attempts=3)
def returns_object():
    return object()


@task(max_attempts=3)
def returns_nul():
    return {"text": "before \x00 after"}


@task(max_attempts=2)
def raises_system_exit():
    raise SystemExit(3)


@task()
def raises_job_cancelled():
    from django_dispatch import JobCancelled

    raise JobCancelled("raised by the task itself, nobody cancelled it")


@task()
def boom_with_signal():
    return "ok"


def not_a_task():
    return "should never run"


@task()
def ordered_step(key, seq, max_sleep=0.01):
    """Records its run window; partition tests check overlap and order."""
    started = time.time()
    time.sleep(random.uniform(0, max_sleep))
    Step.objects.create(
        key=key, seq=seq, started=started, finished=time.time(), worker_pid=os.getpid()
    )
    return seq


@task(takes_context=True)
def count_and_hold(context, key, total, hold_at, hold_file):
    """Counts to ``total`` with a checkpoint per item; on its first attempt it
    stops after ``hold_at`` and waits for ``hold_file`` (the test kills it there)."""
    start = (context.checkpoint or 0) + 1
    for item in range(start, total + 1):
        with transaction.atomic():
            SideEffect.objects.create(key=key, note=str(item), worker_pid=os.getpid())
            context.progress(item)
        if item == hold_at and context.attempt == 1:
            while not Path(hold_file).exists():
                time.sleep(0.02)
    return total


def _tick(key, note):
    SideEffect.objects.create(key=key, note=note, worker_pid=os.getpid(), started_at=timezone.now())


@task(timeout=0.5, max_attempts=2, takes_context=True)
def ignores_timeout(context, key, seconds=60):
    """First attempt: deaf to its timeout, writes a numbered row every 10 ms.

    Later attempts write one row and return, so a test can tell the zombie's
    side effects from the retry's.
    """
    if context.attempt > 1:
        _tick(key, f"attempt {context.attempt}")
        return context.attempt
    _zombie(key, seconds)
    return "late"


@task(timeout=0.5, max_attempts=2, takes_context=True)
def signals_its_own_thread(context, key, marker):
    """First attempt: deaf to its timeout; once the main thread is recycling the process
    (holding the stop signals, reading whether a stop was asked, re-executing), it sends
    SIGTERM to its own thread,
    where the kernel must deliver it (the main thread never takes it). Later attempts write
    one row and return."""
    if context.attempt > 1:
        _tick(key, f"attempt {context.attempt}")
        return context.attempt
    main = threading.main_thread().ident
    # The proof that the signal went: a byte of a shared mapping set right after it, with
    # no system call between (one would let the main thread take the GIL and execve).
    with open(marker, "r+b") as handle:
        sent = mmap.mmap(handle.fileno(), 1)
    # The recycle's steps take a few milliseconds, the GIL switches every 5 by default: switch
    # often, so that this thread gets to look at the main thread while they run.
    sys.setswitchinterval(1e-5)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        frame, names = sys._current_frames().get(main), set()
        while frame is not None:
            names.add(frame.f_code.co_name)
            frame = frame.f_back
        if "run_one" in names and "run" not in names:  # Worker.run returned: the recycle
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            sent[0] = 1
            break
        time.sleep(0.0002)
    _zombie(key, 60)
    return "late"


@task()
def ignores_cancel(key, seconds=60):
    """Deaf to cancellation: writes a numbered row every 10 ms for ``seconds``."""
    _zombie(key, seconds)
    return key


def _zombie(key, seconds):
    """Write a numbered row every 10 ms for ``seconds``, whatever the worker asks."""
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        _tick(key, f"zombie {n}")
        time.sleep(0.01)


@task(timeout=0.3, takes_context=True)
def stops_when_asked(context, key):
    """Over its timeout, but checks ``context.cancelled`` and returns when asked."""
    while not context.cancelled:
        time.sleep(0.01)
    _tick(key, "stopped")
    return "stopped"


@task(timeout=0.3, max_attempts=2, takes_context=True)
async def async_blocks_its_loop(context, path, seconds=60):
    """First attempt: blocks its event loop (cancellation cannot land), appending
    a numbered line to ``path`` every 10 ms. Later attempts append one line."""
    with open(path, "a") as out:
        if context.attempt > 1:
            out.write(f"attempt {context.attempt} {os.getpid()}\n")
            return context.attempt
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            n += 1
            out.write(f"zombie {n} {os.getpid()}\n")
            out.flush()
            time.sleep(0.01)
    return "late"


# --- size limits (tests/store/test_size_limits.py) ---------------------------------------------


@task(max_attempts=3)
def returns_text(size):
    """Returns ``size`` characters; three attempts, so a retry would show."""
    return "x" * size


@task(max_attempts=3, takes_context=True)
def checkpoints_text(context, size):
    """Saves a small checkpoint, then one of ``size`` characters, then returns."""
    context.progress({"done": 1})
    context.progress("x" * size)
    return "saved"


@task()
def raises_long_message(size):
    """Fails with a message of ``size`` characters (with a recognisable start and end)."""
    raise ValueError("START" + "é" * size + "END")


@task()
def raises_nul():
    """Fails with a message holding a NUL character, which jsonb cannot store."""
    raise ValueError("before\x00after")
