"""The one internal task every workflow step runs as.

Its arguments are only ids (a step row and a generation): what to run is
read from the step row and resolved against the registered workflows, so a
job row can never make a worker call an unregistered function.
"""

from django.tasks import task

from .engine import execute_step


@task(takes_context=True)
def run_step(context, workflow_task_id: int, generation: int) -> dict:
    """Run one attempt of workflow step ``workflow_task_id`` (see ``engine.execute_step``)."""
    return execute_step(context, workflow_task_id, generation)
