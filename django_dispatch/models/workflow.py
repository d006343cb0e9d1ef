"""Workflow runs and their steps.

A ``WorkflowRun`` is one execution of a workflow defined in code; each of its
steps is a row of the ``WorkflowTask`` model (a *step* everywhere else: see
its docstring for the class name), all inserted with the run (a snapshot of
the definition: name, handler path, order, dependencies, options). A step
runs as a job of the internal task ``django_dispatch.workflows.tasks.run_step``.

Invariants kept by the database:

* one run per (workflow name, idempotency key) (unique constraint), so two
  concurrent starts with one key create one run;
* step names and sequence numbers are unique within a run;
* states stay in their vocabulary (check constraints).

Only ``django_dispatch.store.workflows`` changes ``state``, ``generation``,
``claim_id`` or any other field after insert.
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..core.workflow_states import RunState, StepState
from .job import KEY_MAX_LENGTH, namespace_field


class WorkflowRun(models.Model):
    id = models.BigAutoField(primary_key=True)
    #: The namespace of the backend that started the run; its steps' jobs go there.
    namespace = namespace_field()
    name = models.CharField(max_length=200, help_text="The workflow's name in code.")
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.RUNNING)
    input = models.JSONField(null=True, blank=True)
    #: The output of the last step (in definition order) once the run succeeded.
    output = models.JSONField(null=True, blank=True)
    #: Bumped by every reopen (a compare-and-set); step jobs carry it.
    generation = models.PositiveIntegerField(default=1)
    idempotency_key = models.CharField(max_length=KEY_MAX_LENGTH, null=True, blank=True)
    queue_name = models.CharField(max_length=100, default="default")
    #: The run and step that started this one (child runs only). ``parent_task``
    #: points to a step; it keeps the model's name (see ``WorkflowTask``).
    parent_run = models.ForeignKey(
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="children"
    )
    parent_task = models.ForeignKey(
        "django_dispatch.WorkflowTask",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    #: Who or what started the run (request id, user id, trace id...): JSON,
    #: ``ctx.call_context`` in every step, copied to child runs.
    call_context = models.JSONField(null=True, blank=True)
    #: A child run started by ``ctx.map``: the set it belongs to (the
    #: ``map_batch`` of its parent step's attempt) and its input's position.
    map_batch = models.CharField(max_length=32, null=True, blank=True)
    map_index = models.PositiveIntegerField(null=True, blank=True)
    #: Set by the child's first success, which counts it on its parent step:
    #: a child replayed and succeeding again is not counted twice.
    map_counted = models.BooleanField(default=False)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "django_dispatch"
        ordering = ["-id"]
        permissions = [
            ("cancel_workflowrun", "Can cancel workflow runs"),
            ("retry_workflowrun", "Can retry stuck workflow runs and skip their steps"),
            ("replay_workflowrun", "Can replay workflow runs from a step"),
        ]
        # No index holds ``updated_at``: the store's run lock touches it in
        # each of a run's transactions, an UPDATE that can be HOT only so.
        indexes = [
            models.Index("name", "created_at", name="dispatch_wfrun_name"),
            # workflows.list_runs/count_runs (``queries.lists``): one namespace's
            # runs of a state or of a workflow, newest first, so a page (keyset
            # on the id) reads only its own entries however many runs there are.
            models.Index("namespace", "state", "id", name="dispatch_wfrun_list_state"),
            models.Index("namespace", "name", "id", name="dispatch_wfrun_list_name"),
        ]
        constraints = [
            models.UniqueConstraint(
                "namespace",
                "name",
                "idempotency_key",
                name="dispatch_wfrun_idempotency_key",
                condition=Q(idempotency_key__isnull=False),
            ),
            models.CheckConstraint(
                condition=Q(state__in=RunState.values), name="dispatch_wfrun_state_valid"
            ),
            # One child per input of a map; the admission and the gather read
            # a set's children by position through it.
            models.UniqueConstraint(
                "map_batch",
                "map_index",
                name="dispatch_wfrun_map_item",
                condition=Q(map_batch__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk} ({self.state})"


class WorkflowTask(models.Model):
    """One step of one run.

    The unit of work of a workflow is called a *step* throughout the code,
    the admin ("workflow steps") and the docs. Only this class, its table,
    its admin URL (``/admin/django_dispatch/workflowtask/``) and the
    ``WorkflowRun.parent_task`` field keep "task": the model name is part of
    the public contract (design.md), and renaming it would rename the table,
    the content type, the permissions and the admin URLs that projects and
    bookmarks already use.
    """

    id = models.BigAutoField(primary_key=True)
    #: The run's namespace (copied, so the step sweeps filter without a join).
    namespace = namespace_field()
    #: No index of its own: the unique (run, name) and (run, sequence) lead
    #: with it, and every step write would keep a third copy of the same key.
    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="steps", db_index=False
    )
    name = models.CharField(max_length=200)
    sequence = models.PositiveIntegerField(help_text="Position in the definition, from 0.")
    handler_path = models.CharField(max_length=255, help_text="Import path of the step function.")
    depends_on = models.JSONField(default=list, blank=True)
    max_attempts = models.PositiveIntegerField(default=1)
    #: Seconds between attempts (a number), or the import path of a function
    #: attempt -> seconds; None: the default exponential backoff.
    backoff = models.JSONField(null=True, blank=True)
    timeout = models.FloatField(null=True, blank=True, help_text="Seconds per attempt.")
    #: Where this step's jobs go (``@wf.step(queue_name=..., priority=...)``);
    #: None: the run's queue, and the step task's default priority.
    queue_name = models.CharField(max_length=100, null=True, blank=True)
    priority = models.SmallIntegerField(null=True, blank=True)

    state = models.CharField(max_length=16, choices=StepState.choices, default=StepState.PENDING)
    #: The run generation this step was last reset in; its jobs carry it.
    generation = models.PositiveIntegerField(default=1)
    attempts = models.PositiveIntegerField(default=0, help_text="Attempts started.")
    failures = models.PositiveIntegerField(
        default=0, help_text="Failed attempts counted against max_attempts."
    )
    #: The fence: set by each claim; every later write by the step's job
    #: matches it, so a write from a lost claim changes nothing.
    claim_id = models.CharField(max_length=32, null=True, blank=True)
    #: The job entrusted with the step (only this job may claim it).
    job_id = models.BigIntegerField(null=True, blank=True)
    #: Indexed only where set (``dispatch_wftask_child_run``): a ``ctx.map``
    #: child's step never has one, and each of its writes would add a NULL entry.
    child_run = models.ForeignKey(
        WorkflowRun,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )
    output = models.JSONField(null=True, blank=True)
    checkpoint = models.JSONField(null=True, blank=True)
    #: One entry per failed or lost attempt: exception_class_path, message,
    #: traceback, attempt, at.
    errors = models.JSONField(default=list, blank=True)
    #: While ``waiting`` on ``ctx.wait_for_event``: the event's name and key
    #: (None: any key); the wait ends at ``wait_until`` (also a sleep's end).
    wait_event_name = models.CharField(max_length=200, null=True, blank=True)
    wait_event_key = models.CharField(max_length=KEY_MAX_LENGTH, null=True, blank=True)
    wait_until = models.DateTimeField(null=True, blank=True)
    #: The results of the step's finished waits, in call order (the n-th wait
    #: call of a re-run returns the n-th entry): {"kind": "event"|"sleep",
    #: "event_id", "payload", "timed_out"}. Cleared by a reopen.
    waits = models.JSONField(default=list, blank=True)
    #: While ``waiting`` on ``ctx.map``: the set of child runs (a random id
    #: their ``map_batch`` repeats), how many there are, how many have been
    #: admitted (made runnable: at most ``map_max_parallel`` ahead of
    #: ``map_done``) and how many succeeded. The counters move in the
    #: children's own transactions, under this run's lock: the fan-in reads
    #: no sibling.
    map_batch = models.CharField(max_length=32, null=True, blank=True)
    map_total = models.PositiveIntegerField(null=True, blank=True)
    map_started = models.PositiveIntegerField(default=0)
    map_done = models.PositiveIntegerField(default=0)
    map_max_parallel = models.PositiveIntegerField(null=True, blank=True)

    #: When the step became runnable (now + backoff for a retry).
    ready_at = models.DateTimeField(null=True, blank=True)
    #: Last sign of life: made ready, claimed, checkpointed.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = "django_dispatch"
        verbose_name = "workflow step"
        verbose_name_plural = "workflow steps"
        ordering = ["run_id", "sequence"]
        indexes = [
            # The autoscaling metric: the oldest runnable step.
            models.Index(
                "namespace",
                "ready_at",
                name="dispatch_wftask_ready",
                condition=Q(state=StepState.READY),
            ),
            # A publish: the steps waiting on its name.
            models.Index(
                "namespace",
                "wait_event_name",
                name="dispatch_wftask_waiting",
                condition=Q(state=StepState.WAITING),
            ),
            # The lost-timer sweep: waits with an end, by their end, so that
            # the sweep reads the waits already over, not every waiting step.
            models.Index(
                "namespace",
                "wait_until",
                name="dispatch_wftask_wait_until",
                condition=Q(state=StepState.WAITING, wait_until__isnull=False),
            ),
            # The sweep's admission of starved maps: the steps waiting for a
            # ctx.map set, not every waiting step.
            models.Index(
                "namespace",
                "map_batch",
                name="dispatch_wftask_map",
                condition=Q(state=StepState.WAITING, map_batch__isnull=False),
            ),
            # A run's deletion: its parents' steps pointing to it (Django's
            # SET_NULL, and the foreign key's check).
            models.Index(
                "child_run",
                name="dispatch_wftask_child_run",
                condition=Q(child_run__isnull=False),
            ),
            # The stale-step sweep.
            models.Index(
                "namespace",
                "heartbeat_at",
                name="dispatch_wftask_live",
                condition=Q(state__in=[StepState.READY, StepState.RUNNING]),
            ),
        ]
        constraints = [
            models.UniqueConstraint("run", "name", name="dispatch_wftask_run_name"),
            models.UniqueConstraint("run", "sequence", name="dispatch_wftask_run_sequence"),
            models.CheckConstraint(
                condition=Q(state__in=StepState.values), name="dispatch_wftask_state_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} of run #{self.run_id} ({self.state})"
