"""Workflows used by tests/runtime/test_workflows.py. Side effects go to SideEffect rows.

Every run's input carries a ``key`` so that tests count what each step did.
"""

import asyncio
import os
import time
from pathlib import Path

from django.db import transaction

from django_dispatch.workflows import Workflow

from .models import SideEffect


def mark(ctx, note):
    SideEffect.objects.create(key=ctx.input["key"], note=note, worker_pid=os.getpid())


def count(key, note):
    return SideEffect.objects.filter(key=key, note=note).count()


def wait_for(condition, seconds=15.0):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.02)


# --- three steps, the second one flaky ------------------------------------------

three = Workflow("tests.three")


@three.step()
def fetch(ctx):
    mark(ctx, "fetch")
    return {"items": [1, 2, 3]}


@three.step(max_attempts=3, backoff=0.05)
def flaky_total(ctx):
    mark(ctx, "flaky")
    if count(ctx.input["key"], "flaky") < 3:
        raise ConnectionError(f"gateway down (attempt {ctx.attempt})")
    return sum(ctx.outputs["fetch"]["items"])


@three.step()
def report(ctx):
    mark(ctx, "report")
    return {"total": ctx.outputs["flaky_total"], "seen": sorted(ctx.outputs)}


# --- a step a test can kill its worker in ------------------------------------------

held = Workflow("tests.held")


@held.step()
def before_hold(ctx):
    mark(ctx, "before")
    return "before"


@held.step()
def hold(ctx):
    mark(ctx, f"hold-start:{os.getpid()}")
    wait_for(lambda: Path(ctx.input["release"]).exists(), seconds=60)
    mark(ctx, "hold-end")
    return "held"


@held.step()
def after_hold(ctx):
    mark(ctx, "after")
    return [ctx.outputs["before_hold"], ctx.outputs["hold"]]


# --- fan-out / fan-in -----------------------------------------------------------------

fan = Workflow("tests.fan")


@fan.step()
def split(ctx):
    mark(ctx, "a")
    return 10


def _branch(ctx, me, other):
    """Record the start, then wait for the other branch to start: proves overlap."""
    mark(ctx, f"{me}-start")
    wait_for(lambda: count(ctx.input["key"], f"{other}-start") > 0, seconds=10)
    mark(ctx, f"{me}-end")
    return ctx.outputs["split"] + (1 if me == "b" else 2)


@fan.step(after=["split"])
def left(ctx):
    return _branch(ctx, "b", "c")


@fan.step(after=["split"])
def right(ctx):
    return _branch(ctx, "c", "b")


@fan.step(after=["left", "right"])
def join(ctx):
    mark(ctx, "d")
    return ctx.outputs["left"] + ctx.outputs["right"]


# --- parking: a gate that fails until the test opens it ------------------------------------

gated = Workflow("tests.gated")


@gated.step()
def prepare(ctx):
    mark(ctx, "prepare")
    return "prepared"


@gated.step(max_attempts=2, backoff=0)
def gate(ctx):
    mark(ctx, "gate")
    if not count(ctx.input["key"], "open"):
        raise PermissionError("the gate is closed")
    return f"opened on attempt {ctx.attempt}, version {count(ctx.input['key'], 'version')}"


@gated.step()
def finish(ctx):
    mark(ctx, "finish")
    return {"gate": ctx.outputs["gate"], "prepare": ctx.outputs["prepare"]}


# --- checkpoints ---------------------------------------------------------------------------

counting = Workflow("tests.counting")


@counting.step(max_attempts=2, backoff=0)
def count_items(ctx):
    start = (ctx.checkpoint or 0) + 1
    for item in range(start, 6):
        with transaction.atomic():
            mark(ctx, f"item-{item}")
            ctx.progress(item)
        if item == 3 and ctx.attempt == 1:
            raise RuntimeError("crash after item 3")
    return {"resumed_from": start}


# --- timeouts ------------------------------------------------------------------------------

slow = Workflow("tests.slow")


@slow.step(timeout=0.3)
def too_slow(ctx):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.02)
    return "late"


# --- child runs ----------------------------------------------------------------------------

child = Workflow("tests.child")


@child.step()
def double(ctx):
    mark(ctx, "child-double")
    return ctx.input["x"] * 2


@child.step()
async def add_one(ctx):
    await asyncio.sleep(0.01)
    return ctx.outputs["double"] + 1


parent = Workflow("tests.parent")


@parent.step()
def begin(ctx):
    mark(ctx, "parent-start")
    return 20


@parent.step()
def delegate(ctx):
    mark(ctx, "parent-delegate")
    return ctx.start_child(child, {"key": ctx.input["key"], "x": ctx.outputs["begin"]})


@parent.step()
def conclude(ctx):
    mark(ctx, "parent-conclude")
    return {"child_result": ctx.outputs["delegate"]}
