"""Workflows with ``atomic=True`` steps (tests/runtime/test_workflow_atomic.py, the chaos suite).

Each step's writes are SideEffect rows with no unique key, so a test counts
every execution whose writes committed. Inside an atomic step nothing is
visible to others before the commit: a step tells the test where it is
through files, never rows.
"""

import os
import threading
import time
from pathlib import Path

from django.utils import timezone

from django_dispatch.models import WorkflowTask
from django_dispatch.workflows import Workflow

from .map_workflows import item
from .models import SideEffect


def _row(ctx, note: str) -> SideEffect:
    return SideEffect.objects.create(
        key=ctx.input["key"], note=note, job_id=str(ctx.run_id), worker_pid=os.getpid()
    )


pay = Workflow("tests.atomic_pay")


@pay.step(atomic=True, max_attempts=3, backoff=0)
def charge(ctx):
    """Writes a row, then fails unless this is attempt ``succeed_on``."""
    _row(ctx, f"attempt-{ctx.attempt}")
    if ctx.attempt != ctx.input.get("succeed_on", 0):
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    return {"charged": ctx.attempt}


@pay.step()
def receipt(ctx):
    _row(ctx, "receipt")
    return ctx.outputs["charge"]


lost = Workflow("tests.atomic_lost")


@lost.step(atomic=True)
def loses_its_claim(ctx):
    """Another job takes the step over (from another connection), then this one writes."""

    def take_over() -> None:
        WorkflowTask.objects.filter(id=ctx.step_id).update(claim_id="the-next-attempt")

    thread = threading.Thread(target=take_over)
    thread.start()
    thread.join()
    _row(ctx, "late")
    return "late"


waits = Workflow("tests.atomic_waits")


@waits.step(atomic=True)
def writes_then_waits(ctx):
    """Its writes before the wait roll back; the run after the wait commits them once."""
    _row(ctx, "before")
    payload = ctx.wait_for_event("atomic-go", key=ctx.input["key"])
    _row(ctx, "after")
    return payload


mapped = Workflow("tests.atomic_map")


@mapped.step(atomic=True)
def fans_out(ctx):
    """Its row commits with the children's start."""
    _row(ctx, "fan")
    return ctx.map(item, [{"key": ctx.input["key"], "n": n} for n in range(3)])


tools = Workflow("tests.atomic_tools")


@tools.step(atomic=True)
def uses_progress(ctx):
    ctx.progress(1)
    _row(ctx, "progressed")
    return ctx.checkpoint


@tools.step(atomic=True)
def saves_an_artifact(ctx):
    _row(ctx, "artifact")
    ctx.save_artifact("report.txt", b"hello")


slow = Workflow("tests.atomic_slow")


@slow.step(atomic=True, timeout=0.3)
def overruns(ctx):
    """Works past its timeout until told to stop, writes, and returns as if done."""
    deadline = time.monotonic() + 10
    while not ctx.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    _row(ctx, "after-timeout")
    Path(ctx.input["done"]).touch()
    return "done"


# --- the chaos suite's load: one effect row per execution ---------------------------
# A PostgreSQL crash fails the attempt it cuts short (a failed attempt, not a
# lost worker): retries let every run end succeeded, as the chaos check expects.


def _effect(ctx) -> dict:
    row = _row(ctx, "effect")
    time.sleep(ctx.input["seconds"])
    # A last write, so that a fault during the work reaches the step's own code.
    SideEffect.objects.filter(pk=row.pk).update(finished_at=timezone.now())
    return {"key": ctx.input["key"]}


effect_atomic = Workflow("tests.effect_step_atomic")


@effect_atomic.step(atomic=True, max_attempts=5, backoff=0.2)
def effect_once(ctx):
    """The chaos suite's atomic step: its effect commits with its output, once."""
    return _effect(ctx)


effect_plain = Workflow("tests.effect_step_plain")


@effect_plain.step(max_attempts=5, backoff=0.2)
def effect_at_least_once(ctx):
    """``effect_once`` without ``atomic=True``: faults duplicate its effect."""
    return _effect(ctx)


# --- the chaos suite's map: a step fanning out to atomic children ------------------

map_child = Workflow("tests.chaos_map_child")


@map_child.step(atomic=True, max_attempts=5, backoff=0.2)
def child_effect(ctx):
    """One effect row per execution, keyed by the child's place in the map."""
    row = SideEffect.objects.create(
        key=ctx.input["key"], note="effect", job_id=str(ctx.run_id), worker_pid=os.getpid()
    )
    time.sleep(ctx.input["seconds"])
    SideEffect.objects.filter(pk=row.pk).update(finished_at=timezone.now())
    return ctx.input["n"]


map_parent = Workflow("tests.chaos_map_parent")


@map_parent.step(max_attempts=5, backoff=0.2)
def fans_out_to_children(ctx):
    """The children's outputs, gathered in the order of the inputs."""
    return ctx.map(map_child, ctx.input["children"], max_parallel=ctx.input["max_parallel"])
