"""The jobs list's columns: what an operator reads first during an incident.

A raw state says too little: "pending" covers a job deferred to tomorrow, a
job backing off between retries and a job nobody is taking; a workflow step
job "succeeded" even when the step it ran failed (the step's failure is the
workflow's to handle, the job did its work). The badge says which. Times are
relative with the exact time on hover; wait and run time are columns of
their own. Everything here works from the row, except the step names of the
page's workflow step jobs, looked up in one query for the whole page
(``attach_steps``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.db.models import Min
from django.utils.encoding import force_str
from django.utils.hashable import make_hashable

from ..core.states import LIVE, JobState
from ..models import Job, WorkflowRun, WorkflowTask
from ..store import read_database_for
from .common import change_url
from .display import age_html, badge_html, format_safe, human_seconds, page_now, per_page

#: The internal task each workflow step runs as.
STEP_TASK = "django_dispatch.workflows.tasks.run_step"
#: The internal task a batch of a large ``ctx.map``'s children runs as
#: (``args``: ``[[[step id, generation], ...]]``).
BATCH_TASK = "django_dispatch.workflows.tasks.run_steps"
#: Characters of the last error shown in the list (the whole error: the job's page).
ERROR_SUMMARY = 80


def job_badge(job: Job, now: Any = None) -> str:
    """The state badge, with what "pending" and "succeeded" really mean for this job."""
    state = job.state
    head = getattr(job, "dispatch_head", None)
    if state in (JobState.PENDING, JobState.SCHEDULED) and not (head is not None and head < job.pk):
        now = now or page_now()  # a waiting job's only: a finished one's badge needs no clock
        if state == JobState.SCHEDULED or (job.run_after and job.run_after > now):
            # Not runnable yet: its run_after (a deferral, or a retry's backoff) is shown;
            # a scheduled job already due is made pending by the next claim.
            label = "retry backoff" if job.attempts else "deferred"
            return format_safe(
                '{}<div class="dispatch-sub">runs {}</div>',
                badge_html("deferred", label),
                age_html(job.run_after, now),
            )
        return badge_html("waiting", "waiting for a worker")
    if state == JobState.BLOCKED or (
        state == JobState.PENDING and head is not None and head < job.pk
    ):
        # Pending keyed jobs behind a live head are demoted to blocked only
        # when a worker next looks at them; to the operator they are blocked now.
        behind = f" behind #{head}" if head is not None and head < job.pk else ""
        return format_safe(
            '<span title="{}">{}</span>',
            blocked_reason(job),
            badge_html("blocked", f"blocked{behind}"),
        )
    if state == JobState.SUCCEEDED and step_outcome(job) == "failed":
        return badge_html("step failed", "step failed")
    # The same for every row of a state: made once per page (``per_page``).
    return per_page((job_badge, type(job), state), lambda: badge_html(state, state_label(job)))


def state_label(job: Job) -> str:
    """``job.get_state_display()``, its choices made a dict once, not once a row."""
    field = type(job)._meta.get_field("state")
    value = make_hashable(job.state)
    # Translated once per page (``per_page``): a lazy label is translated
    # through the active language, a context-local read, on every str().
    return per_page(
        (field, value),
        lambda: force_str(choice_labels(field).get(value, job.state), strings_only=True),
    )


@functools.cache
def choice_labels(field: Any) -> dict[Any, Any]:
    """A field's choices by value (lazy labels stay lazy: translated when shown)."""
    return dict(make_hashable(field.flatchoices))


def blocked_reason(job: Job) -> str:
    """What a blocked job waits for: its partition's head, or room under a limit."""
    if job.partition_key is not None:
        return f"Waits for the job ahead of it in partition {job.partition_key!r} to finish"
    if job.concurrency_key is not None:
        group = f"key {job.concurrency_key!r}" if job.concurrency_key else "the task"
        return f"Over its task's concurrency or rate limit ({group}): runs when the group has room"
    if job.flow_queue is not None:
        return (
            f"Over the concurrency or rate limit of queue {job.flow_queue!r}: "
            "runs when the queue has room"
        )
    return "Waits for room to start"


def step_outcome(job: Job) -> str | None:
    """A step job's report of its step's attempt (``{"outcome": ...}``), if any."""
    if job.task_path != STEP_TASK or not isinstance(job.return_value, dict):
        return None
    outcome = job.return_value.get("outcome")
    return outcome if isinstance(outcome, str) else None


def attach_partition_heads(jobs: Iterable[Job]) -> None:
    """Give each live keyed job of a page its partition's head id (``job.dispatch_head``).

    One grouped query over the page's keys, through ``dispatch_job_part_live``
    (namespace, partition_key, id; live jobs only).
    """
    keyed = [j for j in jobs if j.partition_key and j.state in LIVE]
    if not keyed:
        return
    heads = (
        Job.objects.using(read_database_for(None, Job))
        .filter(
            state__in=list(LIVE),
            partition_key__isnull=False,
            partition_key__in={j.partition_key for j in keyed},
            namespace__in={j.namespace for j in keyed},
        )
        .order_by()
        .values("namespace", "partition_key")
        .annotate(head=Min("id"))
    )
    found = {(h["namespace"], h["partition_key"]): h["head"] for h in heads}
    for job in keyed:
        job.dispatch_head = found.get((job.namespace, job.partition_key))  # type: ignore[attr-defined]


def step_of(job: Job) -> int | None:
    """The workflow step a step job runs, or the first of a map batch's, from its args."""
    args = job.args
    if job.task_path == STEP_TASK and args and isinstance(args[0], int):
        return args[0]
    if job.task_path == BATCH_TASK and args and isinstance(args[0], list) and args[0]:
        first = args[0][0]
        if isinstance(first, list) and first and isinstance(first[0], int):
            return first[0]
    return None


def attach_steps(jobs: Iterable[Job]) -> None:
    """Give each workflow step job of a page its step (``job.dispatch_step``), in one
    query; a map batch's job, its first child's step, whose run names the map's."""
    wanted: dict[int, list[Job]] = {}
    for job in jobs:
        step_id = step_of(job)
        if step_id is not None:
            wanted.setdefault(step_id, []).append(job)
    if not wanted:
        return
    steps = WorkflowTask.objects.using(read_database_for(None, WorkflowTask))
    steps = steps.filter(pk__in=list(wanted)).select_related(
        "run", "run__parent_task", "run__parent_run"
    )
    fields = (
        *("id", "name", "state", "run__id", "run__name", "run__parent_task__id"),
        *("run__parent_task__name", "run__parent_run__id", "run__parent_run__name"),
    )
    for step in steps.only(*fields):
        for job in wanted[step.pk]:
            job.dispatch_step = step  # type: ignore[attr-defined]


class JobColumns:
    """``list_display`` columns of ``JobAdmin``."""

    @admin.display(description="State", ordering="state")
    def state_badge(self, job: Job) -> str:
        return job_badge(job)

    @admin.display(description="Task", ordering="task_path")
    def task_display(self, job: Job) -> str:
        step: WorkflowTask | None = getattr(job, "dispatch_step", None)
        if step is not None:
            mapping: WorkflowTask | None = step.run.parent_task
            parent: WorkflowRun | None = step.run.parent_run
            if job.task_path == BATCH_TASK and mapping is not None and parent is not None:
                label = f"{len(job.args[0])} children of map"
                return self._step_html(label, mapping, parent, job.queue_name)
            return self._step_html("step", step, step.run, job.queue_name)
        module, _, name = job.task_path.rpartition(".")
        key = format_safe(" · [{}]", job.partition_key) if job.partition_key else ""
        return format_safe(
            '<span title="{}">{}</span><div class="dispatch-sub">{}{}</div>',
            job.task_path,
            name or module,
            job.queue_name,
            key,
        )

    @staticmethod
    def _step_html(label: str, step: WorkflowTask, run: WorkflowRun, queue: str) -> str:
        """A step job's task cell: ``label``, the step's link, its run's link, the queue.
        A map batch's job names the step that mapped its children, in its run."""
        return format_safe(
            '{} <a href="{}">{}</a><div class="dispatch-sub"><a href="{}">{} #{}</a> · {}</div>',
            label,
            change_url(WorkflowTask, step.pk),
            step.name,
            change_url(WorkflowRun, run.pk),
            run.name,
            run.pk,
            queue,
        )

    @admin.display(description="Enqueued", ordering="enqueued_at")
    def enqueued_age(self, job: Job) -> str:
        return age_html(job.enqueued_at)

    @admin.display(description="Tries", ordering="attempts")
    def tries(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="Runs at", ordering="run_after")
    def run_after_display(self, job: Job) -> str:
        if job.state in (JobState.PENDING, JobState.SCHEDULED, JobState.BLOCKED):
            return age_html(job.run_after)
        return "-"

    @admin.display(description="Waited")
    def wait_display(self, job: Job) -> str:
        """Enqueue (or the deferred time) to first start; still waiting: so far."""
        ready = max(job.enqueued_at, job.deferred_until) if job.deferred_until else job.enqueued_at
        if ready is None:
            return "-"
        if job.started_at is None:
            if job.state in (JobState.PENDING, JobState.SCHEDULED, JobState.BLOCKED):
                waited = (page_now() - ready).total_seconds()
                return format_safe("<em>{}</em>", human_seconds(max(waited, 0)))
            return "-"
        return human_seconds(max((job.started_at - ready).total_seconds(), 0))

    @admin.display(description="Ran")
    def run_display(self, job: Job) -> str:
        """The last attempt's duration; still running: so far."""
        began = job.last_attempted_at or job.started_at
        if began is None:
            return "-"
        if job.finished_at is None:
            if job.state == JobState.RUNNING:
                return format_safe(
                    "<em>{}</em>", human_seconds((page_now() - began).total_seconds())
                )
            return "-"
        return human_seconds(max((job.finished_at - began).total_seconds(), 0))

    @admin.display(description="Finished", ordering="finished_at")
    def finished_age(self, job: Job) -> str:
        return age_html(job.finished_at)

    @admin.display(description="Last error")
    def error_summary(self, job: Job) -> str:
        if not job.errors:
            return ""
        last = job.errors[-1]
        cls = str(last.get("exception_class_path", "?")).rpartition(".")[2]
        text = f"{cls}: {last.get('message', '')}".strip().rstrip(":")
        short = text if len(text) <= ERROR_SUMMARY else text[: ERROR_SUMMARY - 1] + "…"
        return format_safe('<span class="dispatch-error-summary" title="{}">{}</span>', text, short)
