"""The workflows admin: runs with their steps, and the operator's actions.

Rows are read-only here. Cancel, retry (unpark), skip and replay call
``django_dispatch.workflows.services``, which check the state they act on;
the admin reports what changed and what was skipped because it no longer
fitted (a run that finished meanwhile, a step already done).
"""

from __future__ import annotations

import logging
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template import engines
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from ..models import Job, WorkflowRun, WorkflowTask
from ..models.workflow import STEP_DONE, RunState, StepState
from ..workflows import services
from ..workflows.exceptions import ActionNotAllowed, AlreadyReopened
from .common import (
    CappedPaginator,
    RecentValuesFilter,
    change_url,
    has_perm,
    id_list,
    pretty_json,
    render_errors,
    selected_ids,
)

logger = logging.getLogger("django_dispatch.admin")

BOTH = [admin.ActionLocation.CHANGE_LIST, admin.ActionLocation.CHANGE_FORM]

#: The replay page, kept here (one small form) rather than as a template file.
REPLAY_TEMPLATE = """{% extends "admin/base_site.html" %}
{% block breadcrumbs %}<div class="breadcrumbs">
<a href="{% url 'admin:index' %}">Home</a> &rsaquo;
<a href="{{ changelist_url }}">Workflow runs</a> &rsaquo;
<a href="{{ run_url }}">{{ run }}</a> &rsaquo; Replay</div>{% endblock %}
{% block content %}
<p>The chosen step and every step depending on it run again with the code deployed
now; the other steps keep their outputs. Unfinished steps restart too.</p>
<form method="post">{% csrf_token %}{{ form.as_div }}
<div class="submit-row"><input type="submit" value="Replay" class="default"></div>
</form>{% endblock %}
"""


def _current_step() -> Subquery:
    """The first unfinished step of each run, in definition order (one subquery)."""
    return Subquery(
        WorkflowTask.objects.filter(run=OuterRef("pk"))
        .exclude(state__in=list(STEP_DONE))
        .order_by("sequence")
        .values("name")[:1]
    )


def _run_link(run_id: int | None) -> str:
    if run_id is None:
        return "-"
    return format_html('<a href="{}">#{}</a>', change_url(WorkflowRun, run_id), run_id)


def _job_link(job_id: int | None) -> str:
    if job_id is None:
        return "-"
    return format_html('<a href="{}">#{}</a>', change_url(Job, job_id), job_id)


def _last_error(errors: list[dict[str, Any]]) -> str:
    if not errors:
        return ""
    last = errors[-1]
    name = str(last.get("exception_class_path", "")).rsplit(".", 1)[-1]
    return f"{name}: {last.get('message', '')}"


class ReplayForm(forms.Form):
    step = forms.ChoiceField(label="Replay from step")
    #: The generation the operator saw: a reopen by someone else in between
    #: makes this one fail instead of replaying twice.
    generation = forms.IntegerField(widget=forms.HiddenInput)

    def __init__(self, *args: Any, steps: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["step"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(name, name) for name in steps]


class WorkflowTaskInline(admin.StackedInline):
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
        ("started_at", "finished_at", "ready_at"),
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
        "started_at",
        "finished_at",
        "ready_at",
        "output_display",
        "checkpoint_display",
        "errors_display",
    ]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="Attempts (failed / max)")
    def attempts_display(self, step: WorkflowTask) -> str:
        return f"{step.attempts} ({step.failures} / {step.max_attempts})"

    @admin.display(description="Job")
    def job_link(self, step: WorkflowTask) -> str:
        return _job_link(step.job_id)

    @admin.display(description="Child run")
    def child_link(self, step: WorkflowTask) -> str:
        return _run_link(step.child_run_id)

    @admin.display(description="Output")
    def output_display(self, step: WorkflowTask) -> str:
        return pretty_json(step.output)

    @admin.display(description="Checkpoint")
    def checkpoint_display(self, step: WorkflowTask) -> str:
        return pretty_json(step.checkpoint)

    @admin.display(description="Errors (one per failed or lost attempt)")
    def errors_display(self, step: WorkflowTask) -> str:
        return render_errors(step.errors)


class OperatorPermissions:
    """Permission hooks shared by both admins (used by ``@admin.action``)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "cancel_workflowrun")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "retry_workflowrun")

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "replay_workflowrun")


@admin.register(WorkflowRun)
class WorkflowRunAdmin(OperatorPermissions, admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "state",
        "current_step",
        "created_at",
        "updated_at",
        "idempotency_key",
    ]
    list_filter = ["state", ("name", RecentValuesFilter), "created_at"]
    search_fields = ["id__exact", "name", "idempotency_key"]
    search_help_text = "Run id (exact), workflow name or idempotency key."
    list_per_page = 100
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    inlines = [WorkflowTaskInline]
    actions = ["cancel_runs", "retry_runs", "skip_current_steps"]
    fields = [
        ("id", "name", "state", "generation"),
        ("idempotency_key", "queue_name"),
        ("created_at", "updated_at", "finished_at"),
        ("parent_link", "children_links"),
        "steps_table",
        "input_display",
        "output_display",
        "replay_link",
    ]
    readonly_fields = [
        "parent_link",
        "children_links",
        "steps_table",
        "input_display",
        "output_display",
        "replay_link",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        return super().get_queryset(request).annotate(current=_current_step())

    @admin.display(description="Current step", ordering="current")
    def current_step(self, run: WorkflowRun) -> str:
        return getattr(run, "current", None) or "-"

    @admin.display(description="Started by")
    def parent_link(self, run: WorkflowRun) -> str:
        return _run_link(run.parent_run_id)

    @admin.display(description="Child runs")
    def children_links(self, run: WorkflowRun) -> str:
        rows = run.children.order_by("id").values_list("id", "name", "state")
        links = format_html_join(
            ", ",
            '<a href="{}">#{} {}</a> ({})',
            ((change_url(WorkflowRun, i), i, name, state) for i, name, state in rows),
        )
        return links or "-"

    @admin.display(description="Steps")
    def steps_table(self, run: WorkflowRun) -> str:
        """One line per step: what an operator scans first (details below)."""
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    s.name,
                    s.get_state_display(),
                    f"{s.attempts} ({s.failures} failed, max {s.max_attempts})",
                    ", ".join(s.depends_on) or "-",
                    Truncator(_last_error(s.errors)).chars(120) or "-",
                )
                for s in run.steps.order_by("sequence")
            ),
        )
        return format_html(
            '<table class="dispatch-steps"><thead><tr><th>Step</th><th>State</th>'
            "<th>Attempts</th><th>After</th><th>Last error</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            rows,
        )

    @admin.display(description="Input")
    def input_display(self, run: WorkflowRun) -> str:
        return pretty_json(run.input)

    @admin.display(description="Output")
    def output_display(self, run: WorkflowRun) -> str:
        return pretty_json(run.output)

    @admin.display(description="Replay")
    def replay_link(self, run: WorkflowRun) -> str:
        if run.state == RunState.RUNNING:
            return "Runs can be replayed once they succeeded, got stuck or were cancelled."
        url = reverse("admin:django_dispatch_workflowrun_replay", args=[run.pk])
        return format_html('<a class="button" href="{}">Replay from a step…</a>', url)

    # --- actions ------------------------------------------------------------------

    def _report(self, request: HttpRequest, verb: str, done: list[int], skipped: list[int]) -> None:
        text = f"{len(done)} {verb}"
        if skipped:
            text += f", {len(skipped)} skipped ({id_list(skipped)}: not in a state this fits)"
        level = messages.SUCCESS if not skipped else messages.WARNING
        self.message_user(request, text + ".", level if done else messages.WARNING)

    @admin.action(description="Cancel selected runs", permissions=["cancel"], location=BOTH)
    def cancel_runs(self, request: HttpRequest, queryset: Any) -> None:
        done: list[int] = []
        skipped: list[int] = []
        for run_id in selected_ids(queryset):
            (done if services.cancel_run(run_id) else skipped).append(run_id)
        self._report(request, "cancelled", done, skipped)

    @admin.action(description="Retry selected stuck runs", permissions=["retry"], location=BOTH)
    def retry_runs(self, request: HttpRequest, queryset: Any) -> None:
        done: list[int] = []
        skipped: list[int] = []
        for run_id in selected_ids(queryset):
            (done if services.retry_run(run_id) else skipped).append(run_id)
        self._report(request, "retried", done, skipped)

    @admin.action(
        description="Skip the stuck (or current) step of selected runs",
        permissions=["retry"],
        location=BOTH,
    )
    def skip_current_steps(self, request: HttpRequest, queryset: Any) -> None:
        """A stuck run: its failed steps; a running one: its first unfinished step."""
        done: list[int] = []
        skipped: list[int] = []
        for run_id in selected_ids(queryset):
            names = services.stuck_steps(run_id) or services.current_steps(run_id)[:1]
            won = [name for name in names if services.skip_step(run_id, name)]
            (done if won else skipped).append(run_id)
        self._report(request, "had their step skipped", done, skipped)

    # --- replay from a step -----------------------------------------------------------

    def get_urls(self):
        urls = [
            path(
                "<path:object_id>/replay/",
                self.admin_site.admin_view(self.replay_view),
                name="django_dispatch_workflowrun_replay",
            )
        ]
        return urls + super().get_urls()

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not (self.has_view_permission(request) and self.has_replay_permission(request)):
            raise PermissionDenied
        run = self.get_object(request, object_id)
        if run is None:
            raise Http404(f"No workflow run with id {object_id!r}.")
        steps = list(run.steps.order_by("sequence").values_list("name", flat=True))
        if request.method == "POST":
            form = ReplayForm(request.POST, steps=steps)
            if form.is_valid():
                try:
                    services.replay_run(
                        run.pk,
                        form.cleaned_data["step"],
                        generation=form.cleaned_data["generation"],
                    )
                except (ActionNotAllowed, AlreadyReopened) as e:
                    form.add_error(None, str(e))
                else:
                    self.message_user(
                        request,
                        f"Run #{run.pk} replayed from step {form.cleaned_data['step']!r}.",
                        messages.SUCCESS,
                    )
                    return HttpResponseRedirect(change_url(WorkflowRun, run.pk))
        else:
            first = services.stuck_steps(run.pk)[:1] or steps[:1]
            form = ReplayForm(
                initial={"generation": run.generation, "step": first[0] if first else None},
                steps=steps,
            )
        context = {
            **self.admin_site.each_context(request),
            "title": f"Replay {run.name} run #{run.pk} from a step",
            "opts": self.opts,
            "run": run,
            "form": form,
            "run_url": change_url(WorkflowRun, run.pk),
            "changelist_url": reverse("admin:django_dispatch_workflowrun_changelist"),
        }
        request.current_app = self.admin_site.name
        template = engines["django"].from_string(REPLAY_TEMPLATE)
        return TemplateResponse(request, template, context)  # type: ignore[arg-type]


@admin.register(WorkflowTask)
class WorkflowTaskAdmin(OperatorPermissions, admin.ModelAdmin):
    """Every step of every run, to find stuck or failing steps across runs."""

    list_display = ["id", "run_link", "name", "state", "attempts", "failures", "updated_at"]
    list_filter = ["state", ("name", RecentValuesFilter)]
    search_fields = ["run__id__exact", "name"]
    search_help_text = "Run id (exact) or step name."
    list_select_related = False
    list_per_page = 100
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["skip_steps"]
    fields = [
        ("run_link", "name", "sequence", "state"),
        ("handler_path", "depends_on"),
        ("attempts", "failures", "max_attempts", "backoff", "timeout"),
        ("generation", "job_link", "child_link"),
        ("ready_at", "started_at", "heartbeat_at", "finished_at"),
        "output_display",
        "checkpoint_display",
        "errors_display",
    ]
    readonly_fields = [
        "run_link",
        "job_link",
        "child_link",
        "output_display",
        "checkpoint_display",
        "errors_display",
    ]

    @admin.display(description="Run", ordering="run_id")
    def run_link(self, step: WorkflowTask) -> str:
        return _run_link(step.run_id)

    @admin.display(description="Job")
    def job_link(self, step: WorkflowTask) -> str:
        return _job_link(step.job_id)

    @admin.display(description="Child run")
    def child_link(self, step: WorkflowTask) -> str:
        return _run_link(step.child_run_id)

    @admin.display(description="Output")
    def output_display(self, step: WorkflowTask) -> str:
        return pretty_json(step.output)

    @admin.display(description="Checkpoint")
    def checkpoint_display(self, step: WorkflowTask) -> str:
        return pretty_json(step.checkpoint)

    @admin.display(description="Errors (one per failed or lost attempt)")
    def errors_display(self, step: WorkflowTask) -> str:
        return render_errors(step.errors)

    @admin.action(description="Skip selected steps", permissions=["retry"], location=BOTH)
    def skip_steps(self, request: HttpRequest, queryset: Any) -> None:
        done: list[int] = []
        skipped: list[int] = []
        rows = queryset.order_by("pk").values_list("pk", "run_id", "name", "state").iterator()
        for step_id, run_id, name, state in rows:
            fits = state != StepState.SUCCEEDED and services.skip_step(run_id, name)
            (done if fits else skipped).append(step_id)
        text = f"{len(done)} skipped"
        if skipped:
            text += f"; {len(skipped)} left alone ({id_list(skipped)}: already done or run over)"
        self.message_user(
            request, text + ".", messages.SUCCESS if not skipped else messages.WARNING
        )
