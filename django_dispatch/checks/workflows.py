"""Workflows: a step routed to a queue the default backend does not allow."""

from typing import Any

from django.core import checks

from ..core.docs_links import docs_url
from ..workflows.definition import allowed_queues
from ..workflows.registry import registered


@checks.register()
def check_step_routes(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``@wf.step(queue_name=...)`` naming a queue ``TASKS["default"]["QUEUES"]`` does not list.

    Reported here rather than raised when the workflow is defined (at import,
    where it would crash ``check`` and ``runserver``). Like the tasks' E005,
    it sees the workflows whose modules are imported when the checks run;
    starting such a step fails its job with the same words.
    """
    allowed = allowed_queues()
    if not allowed:
        return []
    return [
        checks.Error(
            f"Workflow {workflow.name!r}, step {step.name!r}: queue {step.queue_name!r} is not "
            f"one of the queues TASKS['default']['QUEUES'] allows ({sorted(allowed)}).",
            hint=f"Add it there, or route the step to one of them. See "
            f"{docs_url('workflows', 'routing-steps')}",
            id="django_dispatch.E006",
        )
        for workflow in registered()
        for step in workflow.steps
        if step.queue_name is not None and step.queue_name not in allowed
    ]
