"""The one internal task every workflow step runs as, and the builder of its jobs.

Its arguments are only ids (a step row and a generation): what to run is
read from the step row and resolved against the registered workflows, so a
job row can never make a worker call an unregistered function.

``build_step_job`` lives beside ``run_step`` because a step job is a job of
this task: the attempt code it runs takes the builder as an argument, so
the arrow points from here down to ``attempt`` only.
"""

from django.core.exceptions import ImproperlyConfigured

from ..compat import task
from ..models import Job
from ..tasks.registry import DispatchBackendBase, alias_serving
from .attempt import execute_step
from .batches import execute_steps


@task(takes_context=True)
def run_step(context, step_id: int, generation: int) -> dict:
    """Run one attempt of workflow step ``step_id`` (see ``attempt.execute_step``).

    Step jobs pass both arguments by position, so renaming a parameter
    cannot break the jobs already queued.
    """
    return execute_step(context, step_id, generation, build_job=build_step_job)


@task(takes_context=True)
def run_steps(context, pairs: list) -> dict:
    """Run the children of a ``ctx.map`` batch: ``pairs`` are their steps'
    ``[step_id, generation]`` (see ``attempt.execute_steps``). Its jobs are
    only made by the set that entrusts them with its children's steps."""
    return execute_steps(context, pairs, build_job=build_step_job)


def build_step_job(step_id: int, generation: int, queue_name: str, namespace: str = "") -> Job:
    """An unsaved job of ``run_step`` for one step of a run in ``namespace``,
    with no job-level retries, recorded under an alias serving that namespace."""
    task = run_step if queue_name == run_step.queue_name else run_step.using(queue_name=queue_name)
    backend = task.get_backend()
    if not isinstance(backend, DispatchBackendBase):
        raise ImproperlyConfigured(
            "workflows need TASKS['default'] to use django_dispatch.backend.DispatchBackend."
        )
    job = backend.build_job(task, [step_id, generation], {})
    job.max_attempts = 1  # step attempts are the engine's, not the job's
    job.namespace = namespace
    job.backend = alias_serving(namespace, job.backend)
    return job
