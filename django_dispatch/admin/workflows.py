"""The workflows admin: runs with their steps, and the operator's actions.

Rows are read-only here. Cancel, retry (unpark), skip and replay call
``django_dispatch.workflows.services``, which check the state they act on;
the admin reports what changed and what was skipped because it no longer
fitted (a run that finished meanwhile, a step already done). The replay
page is in ``workflow_replay``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from ..compat import admin_action
from ..models import Job, WorkflowRun, WorkflowTask
from ..models.workflow import STEP_DONE, StepState
from ..workflows import services

# Much the same names as jobs.py imports: one toolkit shared by the admins, listed
# name by name (an import list, not logic to fold).
from .artifacts import artifacts_field
from .common import (
    BOTH,
    CHANGE_FORM_TEMPLATE,
    BigTable,
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
)
from .dag import dag_field
from .history import record
from .workflow_replay import ReplayFromStep


def _current_step() -> Subquery:
    """The first unfinished step of each run, in definition order (one subquery)."""
    return Subquery(
        WorkflowTask.objects.filter(run=OuterRef("pk"))
        .exclude(state__in=list(STEP_DONE))
        .order_by("sequence")
        .values("name")[:1]
    )


def _split[T](items: Iterable[T], act: Callable[[T], bool]) -> tuple[list[T], list[T]]:
    """Apply an operator service to each selected item: (changed, left as they were).

    Each item is its own service call, so one that no longer fits (finished
    meanwhile) never stops the others; it is listed in the report instead.
    """
    done: list[T] = []
    skipped: list[T] = []
    for item in items:
        (done if act(item) else skipped).append(item)
    return done, skipped


def _skip_current_step(run_id: int) -> bool:
    """A stuck run: its failed steps; a running one: its first unfinished step."""
    names = services.stuck_steps(run_id) or services.current_steps(run_id)[:1]
    return bool([name for name in names if services.skip_step(run_id, name)])


def waiting_for(step: WorkflowTask) -> str:
    """What a waiting step waits for, and until when ("" when it is not waiting)."""
    if step.state != StepState.WAITING:
        return ""
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
                child_run__isnull=False, wait_event_name__isnull=True, wait_until__isnull=True
            )
        return waiting

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return self.steps(queryset) if self.value() else queryset


class RunWaitingFilter(WaitingFilter):
    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        return queryset.filter(id__in=self.steps(WorkflowTask.objects.all()).values("run_id"))


def _last_error(errors: list[dict[str, Any]]) -> str:
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
        return link(WorkflowRun, step.child_run_id)

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

    @admin.display(description="Attempts (failed / max)")
    def attempts_display(self, step: WorkflowTask) -> str:
        return f"{step.attempts} ({step.failures} / {step.max_attempts})"


class OperatorActions(SQLiteWriteLockFirst, ReadOnlyRows):
    """Permission hooks (used by ``@admin.action``) and the report shared by both admins.

    Actions run from a change page write inside its transaction: on SQLite
    it starts as the writer (``SQLiteWriteLockFirst``).
    """

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "cancel_workflowrun")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return has_perm(request, "retry_workflowrun")

    def report(
        self, request: HttpRequest, done: list[Any], verb: str, skipped: list[int], why: str
    ) -> None:
        """One message: how many changed, then which were left alone and why.

        ``why`` is formatted with ``n`` (how many were left alone) and ``ids``.
        A warning unless something changed and nothing was left alone.
        """
        pks = (d[0] if isinstance(d, tuple) else d for d in done)  # #19: the admin history
        record(request, self.model, ((pk, f"#{pk}") for pk in pks), f"{verb} (admin action).")  # type: ignore[attr-defined]
        text = f"{len(done)} {verb}"
        if skipped:
            text += why.format(n=len(skipped), ids=id_list(skipped))
        level = messages.SUCCESS if done and not skipped else messages.WARNING
        self.message_user(request, text + ".", level)  # type: ignore[attr-defined]


#: Why a run action left a run alone.
RUN_NOT_FITTING = ", {n} skipped ({ids}: not in a state this fits)"


@admin.register(WorkflowRun)
class WorkflowRunAdmin(OperatorActions, BigTable, ReplayFromStep):
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
        "dag_display",  # #19
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
        "dag_display",  # #19
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

    artifacts_display = artifacts_field("run")  # #18
    dag_display = dag_field  # #19

    @admin.display(description="Started by")
    def parent_link(self, run: WorkflowRun) -> str:
        return link(WorkflowRun, run.parent_run_id)

    @admin.display(description="Child runs")
    def children_links(self, run: WorkflowRun) -> str:
        rows = run.children.order_by("id").values_list("id", "name", "state")
        links = format_html_join(
            ", ",
            "{} ({})",
            ((link(WorkflowRun, i, f"#{i} {name}"), state) for i, name, state in rows),
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
                    f"{s.get_state_display()}: {waiting_for(s)}"
                    if s.state == StepState.WAITING
                    else s.get_state_display(),
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

    input_display = rendered_field("input", "Input")
    output_display = rendered_field("output", "Output")
    call_context_display = rendered_field("call_context", "Call context (who started it)")

    # --- actions: each run on its own (see ``_split``) ------------------------------------

    @admin_action(description="Cancel selected runs", permissions=["cancel"], location=BOTH)
    def cancel_runs(self, request: HttpRequest, queryset: Any) -> None:
        done, skipped = _split(selected_ids(queryset), services.cancel_run)
        self.report(request, done, "cancelled", skipped, RUN_NOT_FITTING)

    @admin_action(description="Retry selected stuck runs", permissions=["retry"], location=BOTH)
    def retry_runs(self, request: HttpRequest, queryset: Any) -> None:
        done, skipped = _split(selected_ids(queryset), services.retry_run)
        self.report(request, done, "retried", skipped, RUN_NOT_FITTING)

    @admin_action(
        description="Skip the stuck (or current) step of selected runs",
        permissions=["retry"],
        location=BOTH,
    )
    def skip_current_steps(self, request: HttpRequest, queryset: Any) -> None:
        done, skipped = _split(selected_ids(queryset), _skip_current_step)
        self.report(request, done, "had their step skipped", skipped, RUN_NOT_FITTING)


@admin.register(WorkflowTask)
class WorkflowTaskAdmin(StepDisplays, OperatorActions, BigTable):
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
        ("generation", "job_link", "child_link"),
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
        "output_display",
        "checkpoint_display",
        "errors_display",
        "artifacts_display",
    ]

    artifacts_display = artifacts_field("step")  # #18
    waits_display = rendered_field("waits", "Finished waits (in call order)")

    @admin.display(description="Waiting for")
    def waiting_display(self, step: WorkflowTask) -> str:
        return waiting_for(step) or "-"

    @admin.display(description="Run", ordering="run_id")
    def run_link(self, step: WorkflowTask) -> str:
        return link(WorkflowRun, step.run_id)

    @admin_action(description="Skip selected steps", permissions=["retry"], location=BOTH)
    def skip_steps(self, request: HttpRequest, queryset: Any) -> None:
        done, skipped = _split(
            selected_rows(queryset, "run_id", "name", "state"),
            lambda row: row[3] != StepState.SUCCEEDED and services.skip_step(row[1], row[2]),
        )
        self.report(
            request,
            done,
            "skipped",
            [row[0] for row in skipped],
            "; {n} left alone ({ids}: already done or run over)",
        )
