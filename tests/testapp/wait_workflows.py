"""Workflows that wait durably (tests/runtime/test_workflow_waits.py).

Side effects go to SideEffect rows.

Every run's input carries a ``key`` so that tests count what each step did,
and each step marks ``started`` before its wait and ``resumed`` after it: a
step re-runs on resume, so ``started`` counts its runs, ``resumed`` its
completions.
"""

import time

from django_dispatch.workflows import EventTimeout, Workflow

from .models import SideEffect
from .workflows import mark

# --- wait for an event (key from the input), then record the payload --------------

awaits = Workflow("tests.awaits")


@awaits.step()
def wait(ctx):
    mark(ctx, "started")
    payload = ctx.wait_for_event(
        "payment", key=ctx.input.get("event_key"), timeout=ctx.input.get("timeout")
    )
    mark(ctx, "resumed")
    return {"payload": payload}


@awaits.step(after=["wait"])
def after(ctx):
    mark(ctx, "after")
    return {"got": ctx.outputs["wait"]["payload"], "context": ctx.call_context}


# --- an order that is cancelled when its payment does not come in time -------------

order = Workflow("tests.order")


@order.step()
def await_payment(ctx):
    try:
        payment = ctx.wait_for_event("payment", key=ctx.input["key"], timeout=ctx.input["timeout"])
    except EventTimeout:
        mark(ctx, "cancelled")
        return {"status": "cancelled"}
    mark(ctx, "paid")
    return {"status": "paid", "amount": payment["amount"]}


# --- a durable sleep ----------------------------------------------------------------

sleeper = Workflow("tests.sleeper")


@sleeper.step()
def nap(ctx):
    mark(ctx, "started")
    ctx.sleep(ctx.input["seconds"])
    mark(ctx, "woke")
    return "rested"


# --- the publish lands between the step's start and its wait being recorded ---------

interleaved = Workflow("tests.interleaved")


@interleaved.step()
def slow_then_wait(ctx):
    mark(ctx, "started")
    deadline = time.monotonic() + 20
    # The test publishes now, then writes "go": the event exists before the wait does.
    while not SideEffect.objects.filter(key=ctx.input["key"], note="go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.02)
    payload = ctx.wait_for_event("interleaved", key=ctx.input["key"])
    mark(ctx, "resumed")
    return payload


# --- two waits in one step, numbered by call order ----------------------------------

twice = Workflow("tests.twice")


@twice.step()
def two_waits(ctx):
    first = ctx.wait_for_event("first", key=ctx.input["key"])
    ctx.sleep(0)
    second = ctx.wait_for_event("second", key=ctx.input["key"])
    mark(ctx, "done")
    return [first, second]


# --- parking without an attempt -----------------------------------------------------

unstorable = Workflow("tests.unstorable")


@unstorable.step(max_attempts=3)
def returns_a_set(ctx):
    return {1, 2}  # not JSON: no retry can fix it


# --- saves an artifact, then parks (output not JSON) until the code is "fixed" -------

reporting = Workflow("tests.reporting")


@reporting.step(max_attempts=1)
def report(ctx):
    artifact = ctx.save_artifact("report", f"attempt {ctx.attempt}".encode())
    if not SideEffect.objects.filter(key=ctx.input["key"], note="fixed").exists():
        return {1, 2}  # not JSON: parks the run without counting an attempt
    return {"artifact": artifact.pk, "attempt": ctx.attempt}


# --- call context reaches child runs -------------------------------------------------

context_child = Workflow("tests.context_child")


@context_child.step()
def child_step(ctx):
    return {"child_context": ctx.call_context}


context_parent = Workflow("tests.context_parent")


@context_parent.step()
def parent_step(ctx):
    return ctx.start_child(context_child, {"key": ctx.input["key"]})


@context_parent.step(after=["parent_step"])
def parent_after(ctx):
    return {"parent_context": ctx.call_context, "child": ctx.outputs["parent_step"]}


# --- a step that ignores its timeout: the worker process is recycled ----------------

stuck = Workflow("tests.stuck")


@stuck.step(timeout=0.5, max_attempts=2)
def never_returns(ctx):
    if ctx.attempt > 1:
        mark(ctx, "second attempt")
        return "done"
    while True:  # ignores ctx.cancelled: only ending the process stops it
        mark(ctx, "tick")
        time.sleep(0.1)
