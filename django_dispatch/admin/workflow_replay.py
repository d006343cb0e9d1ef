"""The workflow run admin's "Replay from a step…" page.

A replay is one compare-and-set on the run's generation
(``services.replay_run``); the form carries the generation the operator saw,
so of two operators replaying the same run one wins and the other is told
so on the form, with nothing changed.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.html import format_html

from ..core.workflow_states import RunState
from ..models import WorkflowRun
from ..workflows import services
from ..workflows.exceptions import ActionNotAllowed, AlreadyReopened
from .common import ReplayPage, change_url
from .history import record_one


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


class ReplayFromStep(ReplayPage):
    """The replay page of ``WorkflowRunAdmin``: its link and form (the rest: ``ReplayPage``)."""

    @admin.display(description="Replay")
    def replay_link(self, run: WorkflowRun) -> str:
        if run.state == RunState.RUNNING:
            return "Runs can be replayed once they succeeded, got stuck or were cancelled."
        return format_html(
            '<a class="button" href="{}">Replay from a step…</a>', self.replay_url(run.pk)
        )

    def replay_page(self, request: HttpRequest, run: WorkflowRun) -> HttpResponse:
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
                    step = form.cleaned_data["step"]
                    record_one(request, run, f"Replayed from step {step!r} (admin action).")
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
        return self.render_replay_page(
            request, run, form, f"Replay {run.name} run #{run.pk} from a step"
        )
