"""The workflow runs admin: each run with its steps, and the operator's actions.

Rows are read-only here; the actions (``workflow_actions``) call
``django_dispatch.workflows.services``, which check the state they act on.
The steps' own pages are in ``workflow_steps``, the replay page in
``workflow_replay``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from ..compat import admin_action
from ..core.workflow_states import STEP_DONE, StepState
from ..models import WorkflowRun, WorkflowTask
from ..workflows import services
from .aliases import AliasSelector, on_selected_alias
from .artifacts import artifacts_field
from .common import (
    BOTH,
    CHANGE_FORM_TEMPLATE,
    BigTable,
    RecentValuesFilter,
    link,
    rendered_field,
    selected_ids,
)
from .dag import dag_field
from .workflow_actions import RUN_NOT_FITTING, OperatorActions, apply_each, skip_current_step
from .workflow_replay import ReplayFromStep
from .workflow_steps import RunWaitingFilter, StepInline, last_error, route, waiting_for

#: Child runs linked one by one on a run's page; the rest through the list.
CHILDREN_SHOWN = 20


def _current_step() -> Subquery:
    """The first unfinished step of each run, in definition order (one subquery)."""
    return Subquery(
        WorkflowTask.objects.filter(run=OuterRef("pk"))
        .exclude(state__in=list(STEP_DONE))
        .order_by("sequence")
        .values("name")[:1]
    )


@admin.register(WorkflowRun)
class WorkflowRunAdmin(AliasSelector, OperatorActions, BigTable, ReplayFromStep):
    list_display = [
        "id",
        "namespace",
        "name",
        "state",
        "current_step",
        "created_at",
        "updated_at",
        "idempotency_key",
    ]
    list_filter = [
        "state",
        RunWaitingFilter,
        ("namespace", RecentValuesFilter),
        ("name", RecentValuesFilter),
        "created_at",
    ]
    search_fields = ["id__exact", "name", "idempotency_key"]
    search_help_text = "Run id (exact), workflow name or idempotency key."
    change_form_template = CHANGE_FORM_TEMPLATE
    inlines = [StepInline]
    actions = ["cancel_runs", "retry_runs", "skip_current_steps"]
    fields = [
        ("id", "name", "state", "generation"),
        ("idempotency_key", "queue_name"),
        ("created_at", "updated_at", "finished_at"),
        ("parent_link", "children_links"),
        "dag_display",
        "steps_table",
        "call_context_display",
        "input_display",
        "output_display",
        "replay_link",
        "artifacts_display",
    ]
    readonly_fields = [
        "parent_link",
        "children_links",
        "dag_display",
        "steps_table",
        "call_context_display",
        "input_display",
        "output_display",
        "replay_link",
        "artifacts_display",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        return super().get_queryset(request).annotate(current=_current_step())

    @admin.display(description="Current step", ordering="current")
    def current_step(self, run: WorkflowRun) -> str:
        return getattr(run, "current", None) or "-"

    artifacts_display = artifacts_field("run")
    dag_display = dag_field

    @admin.display(description="Started by")
    def parent_link(self, run: WorkflowRun) -> str:
        return link(WorkflowRun, run.parent_run_id)

    @admin.display(description="Child runs")
    def children_links(self, run: WorkflowRun) -> str:
        """The first children, then a link to the list of all (a map may have 10,000)."""
        rows = list(
            run.children.order_by("id").values_list("id", "name", "state")[: CHILDREN_SHOWN + 1]
        )
        links = format_html_join(
            ", ",
            "{} ({})",
            (
                (link(WorkflowRun, i, f"#{i} {name}"), state)
                for i, name, state in rows[:CHILDREN_SHOWN]
            ),
        )
        if len(rows) > CHILDREN_SHOWN:
            url = reverse("admin:django_dispatch_workflowrun_changelist")
            url = on_selected_alias(f"{url}?{urlencode({'parent_run__id__exact': run.pk})}")
            links = format_html(
                '{}, … <a href="{}">all {} child runs</a>', links, url, run.children.count()
            )
        return links or "-"

    @admin.display(description="Steps")
    def steps_table(self, run: WorkflowRun) -> str:
        """One line per step: what an operator scans first (details below)."""
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    s.name,
                    f"{s.get_state_display()}: {waiting_for(s)}"
                    if s.state == StepState.WAITING
                    else s.get_state_display(),
                    f"{s.attempts} ({s.failures} failed, max {s.max_attempts})",
                    ", ".join(s.depends_on) or "-",
                    route(s) or "-",
                    Truncator(last_error(s.errors)).chars(120) or "-",
                )
                for s in run.steps.order_by("sequence")
            ),
        )
        return format_html(
            '<table class="dispatch-steps"><thead><tr><th>Step</th><th>State</th>'
            "<th>Attempts</th><th>After</th><th>Route</th><th>Last error</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            rows,
        )

    input_display = rendered_field("input", "Input")
    output_display = rendered_field("output", "Output")
    call_context_display = rendered_field("call_context", "Call context (who started it)")

    # --- actions: each run on its own (see ``apply_each``) ------------------------------------

    @admin_action(description="Cancel selected runs", permissions=["cancel"], location=BOTH)
    def cancel_runs(self, request: HttpRequest, queryset: Any) -> None:
        done, skipped = apply_each(selected_ids(queryset), services.cancel_run)
        self.report(request, done, "cancelled", skipped, RUN_NOT_FITTING)

    @admin_action(description="Retry selected stuck runs", permissions=["retry"], location=BOTH)
    def retry_runs(self, request: HttpRequest, queryset: Any) -> None:
        done, skipped = apply_each(selected_ids(queryset), services.retry_run)
        self.report(request, done, "retried", skipped, RUN_NOT_FITTING)

    @admin_action(
        description="Skip the stuck (or current) step of selected runs",
        permissions=["retry"],
        location=BOTH,
    )
    def skip_current_steps(self, request: HttpRequest, queryset: Any) -> None:
        done, skipped = apply_each(selected_ids(queryset), skip_current_step)
        self.report(request, done, "had their step skipped", skipped, RUN_NOT_FITTING)
