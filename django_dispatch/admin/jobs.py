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
from django.http import HttpRequest

from .. import services
from ..compat import admin_action
from ..exceptions import AlreadyReplayed
from ..models import DeadLetter, Job
from ..states import JobState
from .artifacts import artifacts_field
from .common import (
    BOTH,
    CHANGE_FORM_TEMPLATE,
    BigTable,
    DeleteThroughAction,
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
from .overview import OverviewPage

logger = logging.getLogger("django_dispatch.admin")

#: Ids per delete statement, so that "select all" never builds one huge IN list.
DELETE_BATCH = 1000


@admin.register(Job)
class JobAdmin(OverviewPage, SQLiteWriteLockFirst, ReadOnlyRows, DeleteThroughAction, BigTable):
    list_display = [
        "id",
        "namespace",
        "state",
        "task_path",
        "queue_name",
        "priority",
        "partition_key",
        "attempts",
        "enqueued_at",
        "started_at",
        "finished_at",
    ]
    list_filter = [
        "state",
        ("namespace", RecentValuesFilter),
        ("queue_name", RecentValuesFilter),
        ("task_path", RecentValuesFilter),
    ]
    search_fields = ["id__exact", "task_path", "partition_key", "idempotency_key"]
    search_help_text = "Job id (exact), task path, partition key or idempotency key."
    change_form_template = CHANGE_FORM_TEMPLATE
    actions = ["cancel_jobs", "retry_jobs", "delete_finished_jobs"]

    # What an operator looks for first (state, errors, arguments) comes
    # first; the lease internals are folded away.
    fieldsets = [
        (
            None,
            {
                "fields": [
                    ("id", "state"),
                    "task_path",
                    ("queue_name", "priority", "backend", "namespace"),
                    ("partition_key", "idempotency_key"),
                    ("attempts", "max_attempts", "worker_lost_count"),
                ]
            },
        ),
        ("Errors", {"fields": ["errors_display", "dead_letter_link"]}),
        ("Artifacts", {"fields": ["artifacts_display"]}),  # #18
        (
            "Data",
            {
                "fields": [
                    ("args_display", "kwargs_display"),
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
        "worker_ids_display",
        "args_display",
        "kwargs_display",
        "checkpoint_display",
        "return_value_display",
        "errors_display",
        "dead_letter_link",
        "artifacts_display",
    ]

    # --- permissions: read-only rows; state changes only through actions ----

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "cancel_job")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "retry_job")

    # --- detail page ----------------------------------------------------------

    worker_ids_display = rendered_field("worker_ids", "Worker ids (one per attempt)")
    artifacts_display = artifacts_field("job")
    args_display = rendered_field("args", "Args")
    kwargs_display = rendered_field("kwargs", "Kwargs")
    checkpoint_display = rendered_field("checkpoint", "Checkpoint")
    return_value_display = rendered_field("return_value", "Return value")
    errors_display = rendered_field("errors", "Errors (one per failed attempt)", render_errors)

    @admin.display(description="Dead letter")
    def dead_letter_link(self, job: Job) -> str:
        if job.state != JobState.FAILED:
            return "-"
        letter = DeadLetter.objects.filter(job_id=job.pk).order_by("-id").first()
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
        cancelled = skipped = 0
        for job_id in selected_ids(queryset):
            if services.cancel(job_id):
                cancelled += 1
            else:
                skipped += 1
        self.message_user(
            request,
            f"{cancelled} cancelled, {skipped} skipped (already finished).",
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
            DeadLetter.objects.filter(job_id=job_id, replayed_at__isnull=True)
            .order_by("-id")
            .values_list("pk", flat=True)
            .first()
        )
        if letter is None:
            return None
        try:
            services.replay(letter, replayed_by=username(request))
        except AlreadyReplayed:
            return None
        except Exception as e:  # reported to the operator, never a 500
            logger.warning("admin: replay of dead letter %s failed", letter, exc_info=True)
            return f"{type(e).__name__}: {e}"
        return True

    @admin.action(description="Delete selected finished jobs", permissions=["delete"])
    def delete_finished_jobs(self, request: HttpRequest, queryset: Any) -> None:
        ids = list(selected_ids(queryset))
        deleted = sum(
            services.delete_finished_jobs(ids[i : i + DELETE_BATCH])
            for i in range(0, len(ids), DELETE_BATCH)
        )
        self.message_user(
            request,
            f"{deleted} deleted, {len(ids) - deleted} skipped (not finished).",
            messages.SUCCESS if deleted else messages.WARNING,
        )
