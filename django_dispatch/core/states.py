"""The job state vocabulary and the transitions allowed between states.

One table, read by the store (which performs transitions) and by the test
suite, which runs with a PostgreSQL trigger generated from it
(``tests/transitions.py``): a store statement that makes a transition not
listed here fails the test that caused it. Django's
four ``TaskResultStatus`` values are a coarser view, mapped in ``to_status``.
"""

from django.db import models

from ..compat import TaskResultStatus


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"  # runnable once run_after has passed
    #: Waiting behind an earlier job of its partition, or set aside by a
    #: concurrency, rate or queue limit; out of the claim index until that job
    #: finishes (or the limit frees a slot) and promotes it back to pending.
    BLOCKED = "blocked", "Blocked"
    RUNNING = "running", "Running"  # leased to one worker
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"  # out of attempts, or not retryable
    CANCELLED = "cancelled", "Cancelled"


#: The states a job may still leave, finished ones, and those waiting to run. Lists,
#: in this order: the partial indexes' conditions (and so the migrations) name them.
LIVE_STATES = [JobState.PENDING, JobState.BLOCKED, JobState.RUNNING]
FINISHED_STATES = [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]
WAITING_STATES = [JobState.PENDING, JobState.BLOCKED]
TERMINAL = frozenset(FINISHED_STATES)
LIVE = frozenset(LIVE_STATES)

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # claim; demote behind its partition's head; cancel
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.BLOCKED, JobState.CANCELLED}),
    # promote when the partition's head finishes; cancel
    JobState.BLOCKED: frozenset({JobState.PENDING, JobState.CANCELLED}),
    # finish; fail for good; retry, reclaim or hand back (-> pending); cancel
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.PENDING, JobState.CANCELLED}
    ),
    # terminal states are final; replay creates a new job
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def can_transition(src: str, dst: str) -> bool:
    return JobState(dst) in TRANSITIONS[JobState(src)]


_STATUS = {
    JobState.PENDING: TaskResultStatus.READY,
    JobState.BLOCKED: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    # django.tasks has no "cancelled"; a cancelled job reports FAILED with a
    # JobCancelled error (see tasks.results.result_from_job).
    JobState.CANCELLED: TaskResultStatus.FAILED,
}


def to_status(state: str) -> TaskResultStatus:
    return _STATUS[JobState(state)]
