"""Errors raised by workflows. Each message says what was wrong and what to do."""

# ActionNotAllowed is raised by the store, so it is defined below it; re-exported here.
from ..exceptions import ActionNotAllowed as ActionNotAllowed
from ..exceptions import DispatchError, JobCancelled, TaskTimeout


class WorkflowDefinitionError(DispatchError):
    """A workflow definition is invalid (raised when its module is imported)."""


class UnknownWorkflow(DispatchError):
    """A run names a workflow or step that the code no longer defines."""


class StepTimeout(TaskTimeout):
    """A step's attempt ran longer than its ``timeout``."""


class EventTimeout(DispatchError):
    """``ctx.wait_for_event(..., timeout=...)`` ended without a matching event.

    Raised in the step (in the re-run after the timeout), which may catch it
    and go on, e.g. cancel the order that was never paid.
    """


class StepLost(JobCancelled):
    """This attempt no longer holds its step (run cancelled or reopened, step
    skipped or swept): stop; whatever the step returns is discarded."""


class StepJobLost(DispatchError):
    """A step's job ended (failed, cancelled, purged) without finishing the step.

    Recorded on the step by the maintenance sweep, which counts it as a
    failed attempt; never raised.
    """


class ChildRunCancelled(DispatchError):
    """The child run a step was waiting for was cancelled."""


class InvalidMap(DispatchError):
    """A ``ctx.map()`` call that no retry can fix: too many inputs, an input
    that is not JSON, a bad ``max_parallel``. The step fails without retry."""


class AlreadyReopened(ActionNotAllowed):
    """Another reopen of the run won the compare-and-set on its generation."""
