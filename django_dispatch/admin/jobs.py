"""The jobs admin: a read-only window on the queue, with cancel, retry and delete.

Job rows are only ever changed by the store, so this admin edits nothing
itself: every action calls a service, which checks the state it acts on
(cancelling a job that just finished is a no-op that we report as skipped).
The changelist is built to stay cheap on a table with millions of finished
rows: a capped count, sampled filter values, no facet counts.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION
from django.db.models import QuerySet
from django.http import HttpRequest

from .. import services
from ..compat import admin_action
from ..core.states import LIVE_STATES, QUEUED_STATES, JobState
from ..exceptions import AlreadyReplayed
from ..models import DeadLetter, Job
from ..store import db_alias, read_database_for
from .aliases import AliasSelector
from .artifacts import artifacts_field
from .bulk import BulkRetryPage
from .common import (
    BOTH,
    CHANGE_FORM_TEMPLATE,
    BigTable,
    DeleteThroughAction,
    NamespaceColumn,
    ReadOnlyRows,
    RecentValuesFilter,
    SQLiteWriteLockFirst,
    has_perm,
    id_list,
    link,
    render_errors,
    rendered_field,
    selected_ids,
    selected_rows,
    username,
)
from .history import record
from .job_columns import JobColumns, attach_partition_heads, attach_steps, step_of
from .job_parts import job_list_parts
from .job_search import parse_arguments_term, search_arguments
from .overview import OverviewPage
from .usage import usage_field

logger = logging.getLogger("django_dispatch.admin")

#: Ids per delete statement, so that "select all" never builds one huge IN list.
DELETE_BATCH = 1000


class CallContextFilter(admin.SimpleListFilter):
    """Jobs with or without a call context; a value is found with the search box."""

    title = "call context"
    parameter_name = "call_context"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("set", "Set"), ("none", "None")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if self.value() == "set":
            return queryset.filter(call_context__isnull=False)
        if self.value() == "none":
            return queryset.filter(call_context__isnull=True)
        return queryset


@admin.register(Job)
class JobAdmin(
    AliasSelector,
    NamespaceColumn,
    OverviewPage,
    BulkRetryPage,
    JobColumns,
    SQLiteWriteLockFirst,
    ReadOnlyRows,
    DeleteThroughAction,
    BigTable,
):
    # Fits 1280 px with both sidebars open (tests/admin/test_admin_console_browser.py):
    # the task cell carries the queue and partition key, the state cell a
    # deferred job's run_after; namespace and priority are filters or on the
    # job's page. The namespace column: only with several (``NamespaceColumn``).
    list_display = [
        "id",
        "namespace",
        "state_badge",
        "task_display",
        "tries",
        "enqueued_age",
        "wait_display",
        "run_display",
        "error_summary",
    ]
    #: The fields each column reads (``paging.listed_fields``); "": every row's
    #: ``__str__``, ``attach_steps`` and ``attach_partition_heads``.
    list_reads = {
        "": ("task_path", "state", "namespace", "partition_key", "args"),
        "state_badge": (
            "state",
            "run_after",
            "attempts",
            "partition_key",
            "concurrency_key",
            "flow_queue",
            "task_path",
            "return_value",
        ),
        "task_display": ("task_path", "queue_name", "partition_key"),
        "tries": ("attempts", "max_attempts"),
        "enqueued_age": ("enqueued_at",),
        "wait_display": ("enqueued_at", "deferred_until", "started_at", "state"),
        "run_display": ("last_attempted_at", "started_at", "finished_at", "state"),
        "run_after_display": ("state", "run_after"),
        "finished_age": ("finished_at",),
        "error_summary": ("errors",),
    }
    list_filter = [
        "state",
        CallContextFilter,
        ("namespace", RecentValuesFilter),
        ("queue_name", RecentValuesFilter),
        ("task_path", RecentValuesFilter),
    ]
    search_fields = ["id__exact", "task_path", "partition_key", "idempotency_key", "call_context"]
    search_help_text = (
        "Job id (exact), task path, partition key, idempotency key or call context text; or "
        'arguments or call context as JSON: {"customer_id": 42} (keyword arguments or call '
        "context) or [42] (positional), among the newest 100,000 jobs."
    )
    change_form_template = CHANGE_FORM_TEMPLATE
    actions = ["cancel_jobs", "retry_jobs", "delete_finished_jobs"]

    # What an operator looks for first (state, errors, arguments) comes
    # first; the lease internals are folded away.
    fieldsets = [
        (
            None,
            {
                "fields": [
                    ("id", "state", "state_badge"),
                    "task_path",
                    "workflow_step",
                    ("queue_name", "priority", "backend", "namespace"),
                    ("partition_key", "idempotency_key"),
                    ("attempts", "max_attempts", "worker_lost_count"),
                ]
            },
        ),
        ("Errors", {"fields": ["errors_display", "dead_letter_link"]}),
        ("Artifacts", {"fields": ["artifacts_display"]}),  # #18
        ("Resources and usage", {"fields": ["usage_display"]}),  # #16
        (
            "Data",
            {
                "fields": [
                    ("args_display", "kwargs_display"),
                    "call_context_display",
                    ("checkpoint_display", "return_value_display"),
                ]
            },
        ),
        (
            "Timing",
            {
                "fields": [
                    ("enqueued_at", "run_after", "deferred_until"),
                    ("started_at", "last_attempted_at", "finished_at"),
                ]
            },
        ),
        (
            "Lease",
            {
                "classes": ["collapse"],
                "fields": [
                    ("worker_id", "lease_epoch"),
                    ("lease_expires_at", "heartbeat_at"),
                    "worker_ids_display",
                ],
            },
        ),
    ]
    readonly_fields = [
        "state_badge",
        "workflow_step",
        "worker_ids_display",
        "args_display",
        "kwargs_display",
        "call_context_display",
        "checkpoint_display",
        "return_value_display",
        "errors_display",
        "dead_letter_link",
        "artifacts_display",
        "usage_display",
    ]

    # --- permissions: read-only rows; state changes only through actions ----

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "cancel_job")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "retry_job")

    # --- list: finished and live jobs read apart, step names in one query, search --

    def list_parts(self, queryset: QuerySet[Job]) -> list[QuerySet[Job]]:
        """Finished jobs by namespace, then the live ones (``job_parts``)."""
        return job_list_parts(queryset)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        changelist = super().get_changelist_instance(request)
        attach_steps(changelist.result_list)
        attach_partition_heads(changelist.result_list)
        return changelist

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        value = parse_arguments_term(search_term)
        if value is None:
            return super().get_search_results(request, queryset, search_term)
        return search_arguments(queryset, value), False

    # --- detail page: only the actions that can act on this job ------------------

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        job = super().get_object(request, object_id, from_field)
        request.dispatch_job = job  # type: ignore[attr-defined]
        return job

    def get_actions(self, request, action_location=None):
        actions = super().get_actions(request, action_location)
        job = getattr(request, "dispatch_job", None)
        if job is not None and str(action_location).endswith("CHANGE_FORM"):
            if job.state not in LIVE_STATES:
                actions.pop("cancel_jobs", None)
            waiting_retry = job.state in QUEUED_STATES and job.attempts > 0
            if not (waiting_retry or job.state == JobState.FAILED):
                actions.pop("retry_jobs", None)
            if job.state not in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
                actions.pop("delete_finished_jobs", None)
        return actions

    @admin.display(description="Workflow step")
    def workflow_step(self, job: Job) -> str:
        if step_of(job) is None:
            return "-"
        attach_steps([job])
        return self.task_display(job)

    # --- detail page ----------------------------------------------------------

    worker_ids_display = rendered_field("worker_ids", "Worker ids (one per attempt)")
    artifacts_display = artifacts_field("job")
    usage_display = usage_field()
    args_display = rendered_field("args", "Args")
    kwargs_display = rendered_field("kwargs", "Kwargs")
    call_context_display = rendered_field("call_context", "Call context (who enqueued it)")
    checkpoint_display = rendered_field("checkpoint", "Checkpoint")
    return_value_display = rendered_field("return_value", "Return value")
    errors_display = rendered_field("errors", "Errors (one per failed attempt)", render_errors)

    @admin.display(description="Dead letter")
    def dead_letter_link(self, job: Job) -> str:
        if job.state != JobState.FAILED:
            return "-"
        letter = (
            DeadLetter.objects.using(read_database_for(None, DeadLetter))
            .filter(job_id=job.pk)
            .order_by("-id")
            .first()
        )
        if letter is None:
            return "none (deleted by retention)"
        return link(DeadLetter, letter.pk, f"Dead letter #{letter.pk}")

    # --- actions ----------------------------------------------------------------

    @admin_action(
        description="Cancel selected jobs",
        permissions=["cancel"],
        location=BOTH,
    )
    def cancel_jobs(self, request: HttpRequest, queryset: Any) -> None:
        cancelled: list[int] = []
        skipped = 0
        for job_id in selected_ids(queryset):
            if services.cancel(job_id):
                cancelled.append(job_id)
            else:
                skipped += 1
        record(request, Job, ((i, f"job #{i}") for i in cancelled), "Cancelled (admin action).")
        self.message_user(
            request,
            f"{len(cancelled)} cancelled, {skipped} skipped (already finished).",
            messages.SUCCESS if cancelled else messages.WARNING,
        )

    @admin_action(
        description="Retry selected jobs now",
        permissions=["retry"],
        location=BOTH,
    )
    def retry_jobs(self, request: HttpRequest, queryset: Any) -> None:
        """Waiting retries run now; failed jobs are replayed from their dead letter."""
        retried = replayed = 0
        skipped: list[int] = []
        failed: list[str] = []
        for job_id, state in selected_rows(queryset, "state"):
            if state == JobState.FAILED:
                outcome = self._replay_failed_job(request, job_id)
                if outcome is True:
                    replayed += 1
                elif outcome is None:
                    skipped.append(job_id)
                else:
                    failed.append(f"#{job_id}: {outcome}")
            elif services.retry_now(job_id):
                retried += 1
                record(request, Job, [(job_id, f"job #{job_id}")], "Retried now (admin action).")
            else:
                skipped.append(job_id)
        text = f"{retried} retried, {replayed} replayed, {len(skipped)} skipped"
        if skipped:
            text += (
                f" ({id_list(skipped)}: not waiting for a retry, already replayed, "
                "or no dead letter left)"
            )
        text += "."
        if failed:
            text += f" {len(failed)} failed ({'; '.join(failed)})."
        level = messages.SUCCESS if not skipped and not failed else messages.WARNING
        if failed and not (retried or replayed):
            level = messages.ERROR
        self.message_user(request, text, level)

    def _replay_failed_job(self, request: HttpRequest, job_id: int) -> bool | str | None:
        """True if replayed, None to skip, or the reason it could not be."""
        letter = (
            DeadLetter.objects.using(db_alias())
            .filter(job_id=job_id, replayed_at__isnull=True)
            .order_by("-id")
            .values_list("pk", flat=True)
            .first()
        )
        if letter is None:
            return None
        try:
            result = services.replay(letter, replayed_by=username(request))
        except AlreadyReplayed:
            return None
        except Exception as e:  # reported to the operator, never a 500
            logger.warning("admin: replay of dead letter %s failed", letter, exc_info=True)
            return f"{type(e).__name__}: {e}"
        done = f"Replayed dead letter #{letter} as job #{result.id} (admin action)."
        record(request, Job, [(job_id, f"job #{job_id}")], done)
        record(request, DeadLetter, [(letter, f"dead letter #{letter}")], done)
        return True

    @admin.action(description="Delete selected finished jobs", permissions=["delete"])
    def delete_finished_jobs(self, request: HttpRequest, queryset: Any) -> None:
        ids = list(selected_ids(queryset))
        deleted = sum(
            services.delete_finished_jobs(ids[i : i + DELETE_BATCH])
            for i in range(0, len(ids), DELETE_BATCH)
        )
        if deleted:
            record(
                request,
                Job,
                [(f"{len(ids)} selected", "finished jobs")],
                f"Deleted {deleted} finished jobs (admin action).",
                flag=DELETION,
            )
        self.message_user(
            request,
            f"{deleted} deleted, {len(ids) - deleted} skipped (not finished).",
            messages.SUCCESS if deleted else messages.WARNING,
        )
