"""The map check's workflows: one step that maps a no-op child over N inputs.

``fan_out.start({"items": N})`` runs ``fan``, which starts N runs of
``noop_child`` (one step each, doing nothing) and waits; the run succeeds
once every child has and their outputs are gathered. Drained against N
plain no-op jobs, it measures what a child run costs over a bare job: its
run and step rows, the step's claim, and the fan-in on the parent.
"""

from django_dispatch.workflows import Workflow

noop_child = Workflow("bench_noop_child")
fan_out = Workflow("bench_fan_out")


@noop_child.step()
def child_step(ctx) -> None:
    """Does nothing: the drain measures the map, not the work."""


@fan_out.step()
def fan(ctx):
    return ctx.map(noop_child, range(ctx.input["items"]))
