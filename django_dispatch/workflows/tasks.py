"""The one internal task every workflow step runs as.

Its arguments are only ids (a step row and a generation): what to run is
read from the step row and resolved against the registered workflows, so a
job row can never make a worker call an unregistered function.
"""

from ..compat import task
from .engine import execute_step


@task(takes_context=True)
def run_step(context, step_id: int, generation: int) -> dict:
    """Run one attempt of workflow step ``step_id`` (see ``engine.execute_step``).

    Step jobs pass both arguments by position, so jobs enqueued before the
    parameter was renamed (from ``workflow_task_id``) run unchanged.
    """
    return execute_step(context, step_id, generation)
