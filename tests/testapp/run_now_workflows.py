"""Workflows for tests/runtime/test_run_now.py. Side effects go to SideEffect rows (with the pid
of the process that ran the step), so tests count what ran, and where."""

import time

from django_dispatch.workflows import Workflow

from .models import SideEffect
from .workflows import mark

# --- two steps in a row -------------------------------------------------------------

two = Workflow("tests.run_now_two")


@two.step()
def first(ctx):
    mark(ctx, "first")
    return {"call_context": ctx.call_context}


@two.step(after=["first"])
def second(ctx):
    mark(ctx, "second")
    return "done"


# --- a step that always fails: retried after a long backoff, then parked -------------

failing = Workflow("tests.run_now_failing")


@failing.step(max_attempts=2, backoff=3600)
def boom(ctx):
    mark(ctx, "boom")
    raise ValueError(f"boom (attempt {ctx.attempt})")


# --- a step that holds on until the test says go --------------------------------------

holds = Workflow("tests.run_now_holds")


@holds.step()
def hold(ctx):
    mark(ctx, "started")
    deadline = time.monotonic() + 30
    while not SideEffect.objects.filter(key=ctx.input["key"], note="go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.05)
    mark(ctx, "done")
    return "held"
