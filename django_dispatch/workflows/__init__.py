"""Durable workflows: named, ordered steps that run as jobs, with retries,
parking, replay and child runs. See docs/workflows.md.

::

    from django_dispatch.workflows import Workflow

    signup = Workflow("signup")

    @signup.step()
    def create_account(ctx):
        return {"user_id": make_user(ctx.input["email"])}

    @signup.step(max_attempts=3, backoff=5)
    def send_welcome(ctx):
        mail(ctx.outputs["create_account"]["user_id"])

    run = signup.start({"email": "ada@example.com"}, idempotency_key="signup-ada")

Only the definition API is imported eagerly, so a module defining workflows
can be imported before Django's app registry is ready; the rest loads on
first use.
"""

from typing import TYPE_CHECKING, Any

from .definition import StepDef, Workflow, get_workflow
from .exceptions import (
    ActionNotAllowed,
    AlreadyReopened,
    ChildRunCancelled,
    EventTimeout,
    InvalidMap,
    StepLost,
    StepTimeout,
    UnknownWorkflow,
    WorkflowDefinitionError,
)

__all__ = [
    "ActionNotAllowed",
    "AlreadyReopened",
    "ChildRunCancelled",
    "EventTimeout",
    "InvalidMap",
    "StartChild",
    "StartMap",
    "StepContext",
    "StepDef",
    "StepLost",
    "StepTimeout",
    "UnknownWorkflow",
    "Workflow",
    "WorkflowDefinitionError",
    "cancel_run",
    "children",
    "count_runs",
    "get_workflow",
    "list_runs",
    "oldest_runnable_age",
    "replay_run",
    "retry_run",
    "run_now",
    "skip_step",
]

_SERVICES = {
    "cancel_run",
    "children",
    "replay_run",
    "retry_run",
    "run_now",
    "skip_step",
}

if TYPE_CHECKING:
    from ..queries.ages import oldest_runnable_age
    from ..queries.lists import runs_count as count_runs
    from ..queries.lists import runs_list as list_runs
    from .context import StartChild, StartMap, StepContext
    from .services import (
        cancel_run,
        children,
        replay_run,
        retry_run,
        run_now,
        skip_step,
    )


def __getattr__(name: str) -> Any:
    if name in {"list_runs", "count_runs"}:  # the read side (queries.lists)
        from ..queries import lists

        return getattr(lists, {"list_runs": "runs_list", "count_runs": "runs_count"}[name])
    if name == "oldest_runnable_age":  # per namespace (queries.ages)
        from ..queries.ages import oldest_runnable_age

        return oldest_runnable_age
    if name in _SERVICES:
        from . import services

        return getattr(services, name)
    if name in {"StartChild", "StartMap", "StepContext"}:
        from . import context

        return getattr(context, name)
    raise AttributeError(f"module 'django_dispatch.workflows' has no attribute {name!r}")
