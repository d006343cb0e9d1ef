"""The workflow steps admin: every step of every run, and how a step is shown.

What a waiting step waits for, the filters by it, and the step's read-only
fields serve both the steps' own pages and the run page's inline
(``workflows``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from ..compat import admin_action
from ..core.workflow_states import StepState
from ..models import Job, WorkflowRun, WorkflowTask
from ..workflows import services
from .aliases import AliasSelector, on_selected_alias
from .artifacts import artifacts_field
from .common import (
    BOTH,
    CHANGE_FORM_TEMPLATE,
    BigTable,
    ReadOnlyRows,
    RecentValuesFilter,
    link,
    render_errors,
    rendered_field,
    selected_rows,
)
from .workflow_actions import OperatorActions, apply_each


def waiting_for(step: WorkflowTask) -> str:
    """What a waiting step waits for, and until when ("" when it is not waiting)."""
    if step.state != StepState.WAITING:
        return ""
    if step.map_batch:
        return map_progress(step)
    if step.child_run_id and not step.wait_event_name and not step.wait_until:
        return f"child run #{step.child_run_id}"
    if step.wait_event_name:
        key = f" (key {step.wait_event_key})" if step.wait_event_key is not None else ""
        what = f"event {step.wait_event_name}{key}"
    else:
        what = "time (sleep)"
    if step.wait_until:
        what += f" until {step.wait_until:%Y-%m-%d %H:%M:%S %Z}"
    return what


def map_progress(step: WorkflowTask | Mapping[str, Any]) -> str:
    """A ``ctx.map`` step's set: "37/150 child runs done" (and its bound, its held ones)."""
    get = step.get if isinstance(step, Mapping) else lambda f: getattr(step, f)
    total, done, started = get("map_total") or 0, get("map_done") or 0, get("map_started") or 0
    text = f"{done}/{total} child runs done"
    if get("map_max_parallel"):
        text += f", at most {get('map_max_parallel')} at once ({total - started} held)"
    return text


def route(step: WorkflowTask) -> str:
    """Where the step's jobs go, when its definition routes them ("" when not)."""
    parts = [f"queue {step.queue_name}"] if step.queue_name else []
    if step.priority is not None:
        parts.append(f"priority {step.priority}")
    return ", ".join(parts)


class WaitingFilter(admin.SimpleListFilter):
    """Steps waiting, by what for: an event, a time, a child run (``RunWaitingFilter``:
    runs with such a step)."""

    title = "waiting for"
    parameter_name = "waiting"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("any", "Anything"),
            ("event", "An event"),
            ("time", "A time"),
            ("child", "A child run"),
        ]

    def steps(self, queryset: QuerySet[WorkflowTask]) -> QuerySet[WorkflowTask]:
        value = self.value()
        waiting = queryset.filter(state=StepState.WAITING)
        if value == "event":
            return waiting.filter(wait_event_name__isnull=False)
        if value == "time":
            return waiting.filter(wait_event_name__isnull=True, wait_until__isnull=False)
        if value == "child":
            return waiting.filter(
                Q(child_run__isnull=False) | Q(map_batch__isnull=False),
                wait_event_name__isnull=True,
                wait_until__isnull=True,
            )
        return waiting

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return self.steps(queryset) if self.value() else queryset


class RunWaitingFilter(WaitingFilter):
    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        return queryset.filter(id__in=self.steps(WorkflowTask.objects.all()).values("run_id"))


def last_error(errors: list[dict[str, Any]]) -> str:
    if not errors:
        return ""
    last = errors[-1]
    name = str(last.get("exception_class_path", "")).rsplit(".", 1)[-1]
    return f"{name}: {last.get('message', '')}"


class StepDisplays:
    """The read-only fields a step shows, on the run page and on its own page."""

    @admin.display(description="Job")
    def job_link(self, step: WorkflowTask) -> str:
        return link(Job, step.job_id)

    @admin.display(description="Child run")
    def child_link(self, step: WorkflowTask) -> str:
        if step.map_batch:  # a ctx.map set: the list of its runs, by position
            url = reverse("admin:django_dispatch_workflowrun_changelist")
            url = on_selected_alias(f"{url}?{urlencode({'map_batch': step.map_batch})}")
            return format_html('<a href="{}">{}</a>', url, map_progress(step))
        return link(WorkflowRun, step.child_run_id)

    @admin.display(description="Route (queue, priority)")
    def route_display(self, step: WorkflowTask) -> str:
        return route(step) or "the run's queue"

    output_display = rendered_field("output", "Output")
    checkpoint_display = rendered_field("checkpoint", "Checkpoint")
    errors_display = rendered_field(
        "errors", "Errors (one per failed or lost attempt)", render_errors
    )


class StepInline(StepDisplays, ReadOnlyRows, admin.StackedInline):
    model = WorkflowTask
    fk_name = "run"
    verbose_name = "step"
    verbose_name_plural = "steps in detail"
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True
    fields = [
        ("name", "state", "attempts_display"),
        ("depends_on", "job_link", "child_link"),
        ("route_display", "started_at", "finished_at", "ready_at"),
        "output_display",
        "checkpoint_display",
        "errors_display",
    ]
    readonly_fields = [
        "name",
        "state",
        "attempts_display",
        "depends_on",
        "job_link",
        "child_link",
        "route_display",
        "started_at",
        "finished_at",
        "ready_at",
        "output_display",
        "checkpoint_display",
        "errors_display",
    ]

    @admin.display(description="Attempts (failed / max)")
    def attempts_display(self, step: WorkflowTask) -> str:
        return f"{step.attempts} ({step.failures} / {step.max_attempts})"


@admin.register(WorkflowTask)
class WorkflowTaskAdmin(AliasSelector, StepDisplays, OperatorActions, BigTable):
    """Every step of every run, to find stuck or failing steps across runs.

    Named after its model, like every ModelAdmin (see ``WorkflowTask`` for
    why the model of a step keeps that name); the admin calls it "workflow
    steps".
    """

    list_display = [
        "id",
        "namespace",
        "run_link",
        "name",
        "state",
        "attempts",
        "failures",
        "waiting_display",
        "updated_at",
    ]
    list_filter = [
        "state",
        WaitingFilter,
        ("namespace", RecentValuesFilter),
        ("name", RecentValuesFilter),
    ]
    search_fields = ["run__id__exact", "name"]
    search_help_text = "Run id (exact) or step name."
    list_select_related = False
    change_form_template = CHANGE_FORM_TEMPLATE
    actions = ["skip_steps"]
    fields = [
        ("run_link", "name", "sequence", "state"),
        ("handler_path", "depends_on"),
        ("attempts", "failures", "max_attempts", "backoff", "timeout"),
        ("generation", "job_link", "child_link", "route_display"),
        ("ready_at", "started_at", "heartbeat_at", "finished_at"),
        ("waiting_display", "wait_event_name", "wait_event_key", "wait_until"),
        "waits_display",
        "output_display",
        "checkpoint_display",
        "errors_display",
        "artifacts_display",
    ]
    readonly_fields = [
        "waiting_display",
        "waits_display",
        "run_link",
        "job_link",
        "child_link",
        "route_display",
        "output_display",
        "checkpoint_display",
        "errors_display",
        "artifacts_display",
    ]

    artifacts_display = artifacts_field("step")
    waits_display = rendered_field("waits", "Finished waits (in call order)")

    @admin.display(description="Waiting for")
    def waiting_display(self, step: WorkflowTask) -> str:
        return waiting_for(step) or "-"

    @admin.display(description="Run", ordering="run_id")
    def run_link(self, step: WorkflowTask) -> str:
        return link(WorkflowRun, step.run_id)

    @admin_action(description="Skip selected steps", permissions=["retry"], location=BOTH)
    def skip_steps(self, request: HttpRequest, queryset: Any) -> None:
        done, skipped = apply_each(
            selected_rows(queryset, "run_id", "name", "state"),
            lambda row: row[3] != StepState.SUCCEEDED and services.skip_step(row[1], row[2]),
        )
        self.report(
            request,
            done,
            "skipped",
            [row[0] for row in skipped],
            "; {n} left alone ({ids}: already done, run over, or in a ctx.map child its set "
            "still holds back for max_parallel)",
        )
