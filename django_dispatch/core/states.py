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
    PENDING = "pending", "Pending"  # due: in the claim index, runnable now
    #: Deferred: its run_after was in the future when it was written (an
    #: enqueue with a delay, a retry backing off). Out of the claim index, so
    #: a claim never reads past it; the stager (``store.staging``) makes it
    #: pending once due, on the database clock.
    SCHEDULED = "scheduled", "Scheduled"
    #: Waiting behind an earlier job of its partition, or set aside by a
    #: concurrency, rate or queue limit; out of the claim index until that job
    #: finishes (or the limit frees a slot) and promotes it back to pending.
    BLOCKED = "blocked", "Blocked"
    RUNNING = "running", "Running"  # leased to one worker
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"  # out of attempts, or not retryable
    CANCELLED = "cancelled", "Cancelled"


#: The states a job may still leave, finished ones, and those within the claim's
#: reach (due, or set aside until a slot or its partition frees). Lists, in
#: this order: the partial indexes' conditions (and so the migrations) name them.
LIVE_STATES = [JobState.PENDING, JobState.BLOCKED, JobState.RUNNING, JobState.SCHEDULED]
FINISHED_STATES = [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]
WAITING_STATES = [JobState.PENDING, JobState.BLOCKED]
#: The states of a job that has not started and is not set aside: what
#: ``run_now``, ``retry_now`` and a waiting step's timer act on.
QUEUED_STATES = [JobState.PENDING, JobState.SCHEDULED]
TERMINAL = frozenset(FINISHED_STATES)
LIVE = frozenset(LIVE_STATES)

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # claim; demote behind its partition's head; cancel
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.BLOCKED, JobState.CANCELLED}),
    # staged once due, by retry_now, or by run_now just before its lease; cancel
    JobState.SCHEDULED: frozenset({JobState.PENDING, JobState.CANCELLED}),
    # promote when the partition's head finishes; cancel
    JobState.BLOCKED: frozenset({JobState.PENDING, JobState.CANCELLED}),
    # finish; fail for good; reclaim or hand back (-> pending); a retry backing
    # off (-> scheduled) or due at once (-> pending); cancel
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.PENDING,
            JobState.SCHEDULED,
            JobState.CANCELLED,
        }
    ),
    # terminal states are final; replay creates a new job
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def waiting_state(retry_in: float) -> JobState:
    """The state of a job going back to the queue in ``retry_in`` seconds:
    scheduled while it must wait, pending when due at once."""
    return JobState.SCHEDULED if retry_in > 0 else JobState.PENDING


def can_transition(src: str, dst: str) -> bool:
    return JobState(dst) in TRANSITIONS[JobState(src)]


_STATUS = {
    JobState.PENDING: TaskResultStatus.READY,
    JobState.SCHEDULED: TaskResultStatus.READY,
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
