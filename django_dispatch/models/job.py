"""The job table: it *is* the queue.

Invariants kept by the database rather than by code:

* the claim index is partial on ``state = 'pending'`` (deferred jobs wait
  apart, as ``scheduled``), so the cost of a claim
  does not grow with the number of finished jobs;
* at most one running job per partition key, and one live job per
  (task, idempotency key) (partial unique indexes);
* priority stays in Django's range and the state in our vocabulary
  (check constraints), whatever writes the row.

Only ``django_dispatch.store`` changes ``state`` or any lease field.
"""

import re

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

from ..compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY

# The states of the partial indexes' conditions, in their order (``core.states``).
# Raw SQL and SQLite-bound ORM filters repeat them as literals in this order
# (``store.base.sql_names``: ``{live}``, ``{finished}``): SQLite uses a partial
# index only when the query contains the index's condition term for term.
from ..core.states import FINISHED_STATES, LIVE_STATES, WAITING_STATES, JobState

#: Width of a partition or idempotency key, a job's or a workflow run's
#: (checked before insert, with a clear error).
KEY_MAX_LENGTH = 255
#: Width of a namespace (``TASKS[alias]["OPTIONS"]["NAMESPACE"]``): a
#: PostgreSQL identifier's, so a namespace fits in a channel or lock name.
NAMESPACE_MAX_LENGTH = 63
#: What a namespace may contain: letters, digits, ``_ - . :`` (system check
#: ``django_dispatch.E040``). No quote, so one can be written into raw SQL
#: as a literal (``store.base.namespace_literal``).
NAMESPACE_RE = re.compile(rf"[A-Za-z0-9_.:-]{{0,{NAMESPACE_MAX_LENGTH}}}")


def namespace_field() -> models.CharField:
    """The ``namespace`` column every django_dispatch table carries.

    Rows of one namespace are invisible to workers, leaders and schedulers of
    another; ``""`` (the default) is the namespace of every row written before
    namespaces existed, so today's data keeps its behaviour.
    """
    return models.CharField(
        max_length=NAMESPACE_MAX_LENGTH,
        default="",
        # Also the database's default: a statement that does not name the
        # column (a worker of the previous release during a rolling deploy)
        # writes the default namespace, as it always did.
        db_default="",
        blank=True,
        help_text="The backend's OPTIONS['NAMESPACE'] (empty: the default namespace).",
    )


class Job(models.Model):
    id = models.BigAutoField(primary_key=True)
    namespace = namespace_field()
    task_path = models.CharField(max_length=255, help_text="Import path of the Task object.")
    backend = models.CharField(max_length=100, default="default")
    queue_name = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    #: When the job becomes claimable: enqueue time, the requested run_after,
    #: or the end of a retry's backoff. Database clock.
    run_after = models.DateTimeField(db_default=Now())
    #: The ``run_after`` the task was enqueued with (None when not deferred),
    #: kept so that get_result() rebuilds exactly the Task that was enqueued.
    deferred_until = models.DateTimeField(null=True, blank=True)
    partition_key = models.CharField(max_length=KEY_MAX_LENGTH, null=True, blank=True)
    idempotency_key = models.CharField(max_length=KEY_MAX_LENGTH, null=True, blank=True)
    #: ``@task(concurrency_limit=N)``: at most N running jobs per
    #: (namespace, task, concurrency key); NULL for jobs without a limit. The
    #: key is ``.using(concurrency_key=...)``, ``""`` for the task-wide cap.
    concurrency_key = models.CharField(max_length=KEY_MAX_LENGTH, null=True, blank=True)
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    #: ``@task(rate_limit="N/period")``: at most ``rate_limit`` starts
    #: per fixed window of ``rate_period`` seconds per (task, key). A job with
    #: either limit has a non-NULL ``concurrency_key``: that is what marks it.
    rate_limit = models.PositiveIntegerField(null=True, blank=True)
    rate_period = models.PositiveIntegerField(null=True, blank=True)
    #: ``@task(partition_retry="yield")``: while this keyed job waits
    #: for a retry, it is not its partition's head and lets the next job pass.
    partition_yield = models.BooleanField(default=False, db_default=False)
    #: The queue whose ``DISPATCH["QUEUES"]`` limits set this job aside
    #:: written by the claim's gate when it blocks the job, kept after
    #: its promotion, so that a limited queue's blocked and promoted jobs
    #: are found by index (``dispatch_job_queue_next``). NULL for every
    #: other job: the queue's limits themselves are read from settings.
    flow_queue = models.CharField(max_length=100, null=True, blank=True)

    attempts = models.PositiveIntegerField(default=0, help_text="Attempts started.")
    max_attempts = models.PositiveIntegerField(default=1)
    worker_lost_count = models.PositiveIntegerField(
        default=0, help_text="Attempts lost because the worker died (not task errors)."
    )

    # The lease: who runs the job, which claim this is, and until when.
    worker_id = models.CharField(max_length=100, null=True, blank=True)
    lease_epoch = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    checkpoint = models.JSONField(null=True, blank=True)
    return_value = models.JSONField(null=True, blank=True)
    #: One entry per failed attempt: exception_class_path, message, traceback.
    errors = models.JSONField(default=list, blank=True)
    #: One entry per attempt started, as django.tasks' TaskResult.worker_ids.
    worker_ids = models.JSONField(default=list, blank=True)
    #: The enqueue's OpenTelemetry context (W3C ``traceparent``/``tracestate``
    #: headers), so each attempt's span continues the enqueuer's trace. NULL
    #: without OpenTelemetry, or outside any trace (see observability.tracing).
    trace_context = models.JSONField(null=True, blank=True)
    #: Who or what enqueued the job (a JSON object: ``task.using(call_context=)``
    #: or ``DISPATCH["CALL_CONTEXT"]``'s default), read by the task as
    #: ``context.call_context``; NULL for none. Copied to a replay's job.
    call_context = models.JSONField(null=True, blank=True)

    #: What the job needs of a worker's capacity (``@task(resources=...)``):
    #: {name: whole number}, or NULL for none. ``resource_shape`` is a
    #: 63-bit hash of the needs (``resources.shape_of``), NULL without needs:
    #: the claim finds the distinct shapes pending by a skip scan of their
    #: index and reads only the shapes that fit (see ``store.resources``).
    resources = models.JSONField(null=True, blank=True)
    resource_shape = models.BigIntegerField(null=True, blank=True)
    #: Where the job prefers to run (``.using(locality=...)``): preferred,
    #: not required (a worker of this locality takes it first among equals).
    locality = models.CharField(max_length=100, null=True, blank=True)

    enqueued_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "django_dispatch"
        ordering = ["-id"]
        permissions = [("cancel_job", "Can cancel jobs"), ("retry_job", "Can retry jobs")]
        indexes = [
            # The claim: runnable jobs of one namespace in claim order.
            # Partial, so finished rows never enter it; led by the namespace,
            # so one namespace's backlog is never read by another's claim.
            # Jobs with resource needs are kept out of it: a worker
            # without capacity never reads past a backlog of big jobs.
            models.Index(
                "namespace",
                F("priority").desc(),
                "run_after",
                "id",
                name="dispatch_job_claim",
                condition=Q(state=JobState.PENDING, resource_shape__isnull=True),
            ),
            # The claim of jobs with needs: one shape's runnable jobs in
            # claim order (see ``store.resources``).
            models.Index(
                "namespace",
                "resource_shape",
                F("priority").desc(),
                "run_after",
                "id",
                name="dispatch_job_claim_shaped",
                condition=Q(state=JobState.PENDING, resource_shape__isnull=False),
            ),
            # The stager: deferred jobs by due time, so each sweep reads
            # only the ones due now, in the order they became due (see
            # ``store.staging``); also the count of scheduled jobs.
            models.Index(
                "namespace",
                "run_after",
                "id",
                name="dispatch_job_scheduled",
                condition=Q(state=JobState.SCHEDULED),
            ),
            # The reclaim sweep: running jobs by lease expiry.
            models.Index(
                "namespace",
                "lease_expires_at",
                name="dispatch_job_lease",
                condition=Q(state=JobState.RUNNING),
            ),
            # A partition's head: its oldest live job.
            models.Index(
                "namespace",
                "partition_key",
                "id",
                name="dispatch_job_part_live",
                condition=Q(state__in=LIVE_STATES, partition_key__isnull=False),
            ),
            # Cancelled jobs whose worker has not let go yet (still leased):
            # they keep their partition busy.
            models.Index(
                "namespace",
                "partition_key",
                name="dispatch_job_part_cancelling",
                condition=Q(state=JobState.CANCELLED, lease_expires_at__isnull=False),
            ),
            # Concurrency limits (see ``store.flow``): a group's live
            # jobs by state, to count its running/pending ones and find its
            # next blocked ones in claim order (priority, due time, age); only
            # jobs with a limit enter it. (The count of due pending jobs
            # still walks the group's pending entries; ``run_after`` is
            # checked in the index, without reading the rows.)
            models.Index(
                "namespace",
                "task_path",
                "concurrency_key",
                "state",
                F("priority").desc(),
                "run_after",
                "id",
                name="dispatch_job_conc_next",
                condition=Q(state__in=LIVE_STATES, concurrency_key__isnull=False),
            ),
            # unique_for: finished jobs by idempotency key and age, so an
            # enqueue finds one that finished within its window.
            models.Index(
                "namespace",
                "task_path",
                "idempotency_key",
                "finished_at",
                name="dispatch_job_key_finished",
                condition=Q(state__in=FINISHED_STATES, idempotency_key__isnull=False),
            ),
            # Rate limits: a group's starts (claims) by time, to count
            # those of the current window; only rate-limited jobs enter it.
            models.Index(
                "namespace",
                "task_path",
                "concurrency_key",
                "last_attempted_at",
                name="dispatch_job_rate_starts",
                condition=Q(rate_limit__isnull=False),
            ),
            # Queue-level limits: the jobs a limited queue set aside
            # (blocked) or promoted and not yet claimed (pending), in claim
            # order (priority, due time, age).
            models.Index(
                "namespace",
                "flow_queue",
                "state",
                F("priority").desc(),
                "run_after",
                "id",
                name="dispatch_job_queue_next",
                condition=Q(flow_queue__isnull=False, state__in=WAITING_STATES),
            ),
            # jobs.list/count (``queries.lists``): one namespace's finished
            # jobs of a state, a queue or a task, newest first, so a page
            # (keyset on the id) of the history reads only its own entries.
            # Partial on finished states: no query of the claim or of the
            # limits (all on live jobs) can pick them, and a job enters each
            # once, when it finishes. Live jobs are listed through
            # ``dispatch_job_list_live``, a scan the claim's queries never
            # prefer to their own narrower indexes. The admin's list of every
            # namespace reads them too, one namespace at a time, merged by id
            # (``admin.jobs.JobAdmin.list_parts``): an index without the
            # namespace would cost every job one more entry when it finishes,
            # for that page only.
            models.Index(
                "namespace",
                "state",
                "id",
                name="dispatch_job_list_state",
                condition=Q(state__in=FINISHED_STATES),
            ),
            models.Index(
                "namespace",
                "queue_name",
                "id",
                name="dispatch_job_list_queue",
                condition=Q(state__in=FINISHED_STATES),
            ),
            models.Index(
                "namespace",
                "task_path",
                "id",
                name="dispatch_job_list_task",
                condition=Q(state__in=FINISHED_STATES),
            ),
            models.Index(
                "namespace", "id", name="dispatch_job_list_live", condition=Q(state__in=LIVE_STATES)
            ),
            # Retention: finished jobs by state and age. Partial on terminal
            # states, so it never competes with the claim index.
            models.Index(
                "namespace",
                "state",
                "finished_at",
                name="dispatch_job_finished",
                condition=Q(state__in=FINISHED_STATES),
            ),
        ]
        constraints = [
            # Partitioned FIFO, enforced by the database: whatever the claim
            # does, two jobs of one key (in one
            # namespace) can never be running at once.
            models.UniqueConstraint(
                "namespace",
                "partition_key",
                name="dispatch_job_one_running_per_partition",
                condition=Q(state=JobState.RUNNING, partition_key__isnull=False),
            ),
            # At most one live job per (task, idempotency key); the key is free
            # again once that job has finished.
            models.UniqueConstraint(
                "namespace",
                "task_path",
                "idempotency_key",
                name="dispatch_job_live_idempotency_key",
                condition=Q(state__in=LIVE_STATES, idempotency_key__isnull=False),
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=TASK_MIN_PRIORITY, priority__lte=TASK_MAX_PRIORITY),
                name="dispatch_job_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(state__in=JobState.values), name="dispatch_job_state_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} #{self.pk} ({self.state})"
