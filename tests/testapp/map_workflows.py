"""Workflows of tests/runtime/test_workflow_maps.py: ``ctx.map`` and routed steps.

Every execution of a child's step writes one SideEffect row (no unique key),
with the time it started and ended, so that a test counts executions and
measures how many overlapped.
"""

import os
import time
from datetime import UTC, datetime

from django_dispatch.workflows import Workflow

from .models import SideEffect

# --- ctx.map --------------------------------------------------------------------

item = Workflow("tests.map_item")
#: The same child, with a second attempt.
retried_item = Workflow("tests.map_retried_item")


@retried_item.step(name="double", max_attempts=2, backoff=0.0)
def double_again(ctx):
    return double(ctx)


@item.step()
def double(ctx):
    row = SideEffect.objects.create(
        key=ctx.input["key"],
        note=f"item:{ctx.input['n']}",
        worker_pid=os.getpid(),
        started_at=datetime.now(UTC),
    )
    pause = ctx.input.get("pause", 0) if ctx.input["n"] in ctx.input.get("pause_on", ()) else 0
    time.sleep(ctx.input.get("sleep", 0) or pause)
    SideEffect.objects.filter(pk=row.pk).update(finished_at=datetime.now(UTC))
    if ctx.attempt == 1 and ctx.input["n"] in ctx.input.get("fail_once", ()):
        raise RuntimeError(f"item {ctx.input['n']} fails its first attempt")
    return ctx.input["n"] * 2


fan = Workflow("tests.map_fan")


@fan.step()
def spread(ctx):
    count, key = ctx.input["count"], ctx.input["key"]
    extra = {"sleep": ctx.input.get("sleep", 0)}
    for name in ("fail_once", "pause_on", "pause"):
        if name in ctx.input:
            extra[name] = ctx.input[name]
    inputs = [{"key": key, "n": n, **extra} for n in range(count)]
    child = retried_item if ctx.input.get("retried") else item
    return ctx.map(child, inputs, max_parallel=ctx.input.get("max_parallel"))


@fan.step()
def total(ctx):
    SideEffect.objects.create(key=ctx.input["key"], note="total")
    return {"doubled": ctx.outputs["spread"]}


forgetful = Workflow("tests.map_forgetful")


@forgetful.step()
def forgets(ctx):
    ctx.map(item, [{"key": "x", "n": 1}])
    return "oops"


# --- routing --------------------------------------------------------------------

routed = Workflow("tests.routed")


@routed.step()
def light(ctx):
    SideEffect.objects.create(key=ctx.input["key"], note="light", worker_pid=os.getpid())


@routed.step(queue_name="heavy", priority=5)
def heavy(ctx):
    SideEffect.objects.create(key=ctx.input["key"], note="heavy", worker_pid=os.getpid())
    return os.getpid()


outer = Workflow("tests.map_outer")


@outer.step()
def fans(ctx):
    key = ctx.input["key"]
    return ctx.map(fan, [{"key": key, "count": n} for n in ctx.input["counts"]], max_parallel=1)
