"""The only writer of workflow run and step state.

Each step runs as a job of one internal task (``run_step``). The job first
*claims* its step: a compare-and-set that only the job entrusted with the
step (``job_id``), for the step's current ``generation``, can win; it hands
out a fresh random ``claim_id``. Every later write for that attempt
(checkpoint, output, failure, child run) matches ``id``, ``claim_id`` and
``state = 'running'``, so it changes nothing once the claim is void: the run
was cancelled or reopened, the step skipped or swept, or the job's worker
was lost and the re-run of the job claimed the step anew.

Every transition of a run, and every step transition that may change what
else in the run can go on, opens with ``common.locked_run``: one short
transaction that first locks the run row, so transitions of one run are
serialized and locks are always taken in one order (see ``common``).

Step jobs are built by the caller's ``build_job(step_id, generation,
queue_name) -> Job`` (the workflow engine, which knows the task) and
inserted here, in the same transaction as the step's move to ``ready``.

All times come from the database clock.

Modules: ``common`` (the run lock, the claim fence, moving a run on),
``runs`` (start, cancel, unpark, reopen), ``steps`` (the step job's claim
and writes, skip), ``waits`` (durable waits: record, wake, time out),
``maps`` (``ctx.map``: a step waiting for a set of child runs),
``mapbatch`` (a large set's one-step children run several by one job), ``stepjobs``
(a step's job, routed to its queue and priority), ``sweep`` (recovering
steps whose job ended), ``retention`` (the purge),
``claim_run`` (``run_now``'s claim of one run's next step job by id).
"""

from .claim_run import workflow_run_claim_step
from .common import (
    CHILD_CANCELLED_PATH,
    STEP_JOB_LOST_PATH,
    RunSpec,
    StepJobBuilder,
    StepSpec,
    ancestors,
    descendants,
)
from .mapbatch import (
    workflow_steps_claim,
    workflow_steps_held,
    workflow_steps_release,
    workflow_steps_succeed,
)
from .maps import workflow_step_map
from .mapwave import workflow_step_succeed_with_job
from .orphans import cancel_orphaned_children
from .retention import workflow_runs_purge
from .runs import (
    workflow_run_cancel,
    workflow_run_insert,
    workflow_run_reopen,
    workflow_run_unpark,
)
from .steps import (
    ClaimedStep,
    workflow_step_claim,
    workflow_step_fail,
    workflow_step_holds,
    workflow_step_park,
    workflow_step_progress,
    workflow_step_skip,
    workflow_step_succeed,
    workflow_step_wait_child,
)
from .sweep import step_jobs_retry_now, sweep_stale_steps
from .waits import WaitSpec, rearm_timer, wake_waiting_steps, workflow_step_wait

__all__ = [
    "CHILD_CANCELLED_PATH",
    "STEP_JOB_LOST_PATH",
    "ClaimedStep",
    "RunSpec",
    "StepJobBuilder",
    "StepSpec",
    "WaitSpec",
    "ancestors",
    "cancel_orphaned_children",
    "descendants",
    "rearm_timer",
    "step_jobs_retry_now",
    "sweep_stale_steps",
    "wake_waiting_steps",
    "workflow_run_cancel",
    "workflow_run_claim_step",
    "workflow_run_insert",
    "workflow_run_reopen",
    "workflow_run_unpark",
    "workflow_runs_purge",
    "workflow_step_claim",
    "workflow_step_fail",
    "workflow_step_holds",
    "workflow_step_map",
    "workflow_step_park",
    "workflow_step_progress",
    "workflow_step_skip",
    "workflow_step_succeed",
    "workflow_step_succeed_with_job",
    "workflow_step_wait",
    "workflow_step_wait_child",
    "workflow_steps_claim",
    "workflow_steps_held",
    "workflow_steps_release",
    "workflow_steps_succeed",
]
