"""The workflow run and step vocabularies, and the transitions allowed between states.

Like ``core.states`` for jobs: one table each, read by the store (which
performs the transitions) and by the test suite, which runs with a
PostgreSQL trigger generated from them (``tests/transitions.py``), so a
store statement making a transition not listed here fails the test that
caused it.
"""

from django.db import models


class RunState(models.TextChoices):
    """A run's state. Transitions (all in ``store.workflows``)::

    running   -> succeeded (every step succeeded or was skipped)
    running   -> stuck     (a step ran out of attempts: parked for a person)
    stuck     -> running   (retry / unpark, or skipping the stuck step)
    running, stuck -> cancelled
    succeeded, stuck, cancelled -> running (reopen: replay from a step)
    """

    RUNNING = "running", "Running"
    STUCK = "stuck", "Stuck"
    SUCCEEDED = "succeeded", "Succeeded"
    CANCELLED = "cancelled", "Cancelled"


class StepState(models.TextChoices):
    """A step's state. Transitions (all in ``store.workflows``)::

    pending -> ready      (every dependency succeeded or was skipped; job enqueued)
    ready   -> running    (its job claimed it: a new claim id)
    ready   -> failed     (its job ended without running it, out of attempts)
    running -> running    (re-claimed by its job after that job's worker was lost)
    running -> succeeded | ready (retry, new job) | failed (out of attempts)
    running -> waiting    (it started a child run) -> succeeded | failed
    running -> waiting    (ctx.wait_for_event / sleep) -> ready (woken: event, timeout)
    waiting -> running    (its timer job claims it at wait_until: the wait timed out)
    failed  -> ready      (unpark)
    any unfinished -> skipped (operator) | cancelled (run cancelled)
    any     -> pending    (reopen: the step or one of its ancestors is replayed)
    """

    PENDING = "pending", "Pending"  # waits for its dependencies
    READY = "ready", "Ready"  # its job is queued (maybe waiting out a backoff)
    RUNNING = "running", "Running"  # claimed by its job
    WAITING = "waiting", "Waiting"  # for a child run, an event or a time
    SUCCEEDED = "succeeded", "Succeeded"
    SKIPPED = "skipped", "Skipped"  # by an operator: counts as success, no output
    FAILED = "failed", "Failed"  # out of attempts; its run is stuck
    CANCELLED = "cancelled", "Cancelled"


#: States in which a step counts as done for its dependents.
STEP_DONE = frozenset({StepState.SUCCEEDED, StepState.SKIPPED})
#: States of a step that has work left (a reopen restarts them all).
STEP_UNFINISHED = frozenset(
    {
        StepState.PENDING,
        StepState.READY,
        StepState.RUNNING,
        StepState.WAITING,
        StepState.FAILED,
        StepState.CANCELLED,
    }
)
#: Steps a cancel stops.
STEP_LIVE = frozenset({StepState.PENDING, StepState.READY, StepState.RUNNING, StepState.WAITING})
#: Steps an operator may skip.
STEP_SKIPPABLE = frozenset(
    {StepState.PENDING, StepState.READY, StepState.RUNNING, StepState.WAITING, StepState.FAILED}
)
RUN_ACTIVE = frozenset({RunState.RUNNING, RunState.STUCK})
#: Runs that may be reopened from a step.
RUN_REOPENABLE = frozenset({RunState.SUCCEEDED, RunState.STUCK, RunState.CANCELLED})


#: Every change of a run's state the store may make (see ``RunState``).
RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.RUNNING: frozenset({RunState.SUCCEEDED, RunState.STUCK, RunState.CANCELLED}),
    RunState.STUCK: frozenset({RunState.RUNNING, RunState.CANCELLED}),
    RunState.SUCCEEDED: frozenset({RunState.RUNNING}),  # reopen
    RunState.CANCELLED: frozenset({RunState.RUNNING}),  # reopen
}

_S = StepState
#: Every change of a step's state the store may make (see ``StepState``): its
#: own progress, an operator's skip, a cancel of its run, and a reopen's
#: reset to pending, which any state may take.
STEP_TRANSITIONS: dict[StepState, frozenset[StepState]] = {
    _S.PENDING: frozenset({_S.READY, _S.SKIPPED, _S.CANCELLED}),
    # failed: its job ended without finishing it, and that was the last attempt
    _S.READY: frozenset({_S.RUNNING, _S.FAILED, _S.PENDING, _S.SKIPPED, _S.CANCELLED}),
    _S.RUNNING: frozenset(
        {_S.SUCCEEDED, _S.READY, _S.FAILED, _S.WAITING, _S.PENDING, _S.SKIPPED, _S.CANCELLED}
    ),
    _S.WAITING: frozenset(
        {_S.SUCCEEDED, _S.FAILED, _S.READY, _S.RUNNING, _S.PENDING, _S.SKIPPED, _S.CANCELLED}
    ),
    _S.FAILED: frozenset({_S.READY, _S.PENDING, _S.SKIPPED}),
    _S.SUCCEEDED: frozenset({_S.PENDING}),
    _S.SKIPPED: frozenset({_S.PENDING}),
    _S.CANCELLED: frozenset({_S.PENDING}),
}
