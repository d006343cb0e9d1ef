"""Events nobody acked are purged after DISPATCH["EVENT_UNACKED_RETENTION"],
except those a waiting workflow step could still receive; and the autoscaling
age of runnable steps is per namespace."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from django_dispatch.conf import get_settings
from django_dispatch.core.workflow_states import RunState, StepState
from django_dispatch.models import Event, WorkflowRun, WorkflowTask
from django_dispatch.queries.ages import oldest_runnable_age
from django_dispatch.runtime.retention import purge_events_and_runs
from django_dispatch.store.events import events_purge_unacked

pytestmark = pytest.mark.django_db

DAY = 86400.0


def _event(name, *, age_days, key=None, acked=False, namespace=""):
    published = timezone.now() - timedelta(days=age_days)
    return Event.objects.create(
        name=name,
        key=key,
        namespace=namespace,
        published_at=published,
        acked_at=published if acked else None,
    )


def _waiting(name, *, key=None, run_age_days=60, run_state=RunState.RUNNING):
    run = WorkflowRun.objects.create(
        name="approvals", state=run_state, created_at=timezone.now() - timedelta(days=run_age_days)
    )
    WorkflowTask.objects.create(
        run=run,
        name="wait",
        sequence=0,
        handler_path="tests.testapp.workflows.noop",
        state=StepState.WAITING,
        wait_event_name=name,
        wait_event_key=key,
    )
    return run


def _purge(retention=30 * DAY, **kwargs):
    return events_purge_unacked(retention, batch=2, max_seconds=10, **kwargs)


def test_unacked_events_past_the_retention_go_and_younger_ones_stay():
    old = [_event("order.paid", age_days=40) for _ in range(5)]
    young = _event("order.paid", age_days=10)
    acked_old = _event("order.paid", age_days=40, acked=True)  # EVENT_RETENTION's, not this
    other_namespace = _event("order.paid", age_days=40, namespace="eu")
    assert _purge() == 5  # in batches of 2
    left = set(Event.objects.values_list("pk", flat=True))
    assert left == {young.pk, acked_old.pk, other_namespace.pk}
    assert not left & {e.pk for e in old}
    assert _purge(namespace="eu") == 1


def test_an_event_a_waiting_step_could_still_receive_is_kept_until_it_no_longer_waits():
    kept_any_key = _event("approval", age_days=40, key="doc-1")
    kept_same_key = _event("approval.signed", age_days=40, key="doc-2")
    other_key = _event("approval.signed", age_days=40, key="doc-3")
    before_the_run = _event("approval.late", age_days=40)
    of_a_finished_run = _event("approval.done", age_days=40)
    _waiting("approval")  # any key
    _waiting("approval.signed", key="doc-2")
    _waiting("approval.late", run_age_days=20)  # its run began after the event
    _waiting("approval.done", run_state=RunState.CANCELLED)
    assert _purge() == 3
    left = set(Event.objects.values_list("pk", flat=True))
    assert left == {kept_any_key.pk, kept_same_key.pk}
    assert other_key.pk not in left and before_the_run.pk not in left
    assert of_a_finished_run.pk not in left
    WorkflowTask.objects.update(state=StepState.SUCCEEDED)  # the waits ended
    assert _purge() == 2 and not Event.objects.exists()


def test_the_leaders_retention_duty_applies_it_and_none_keeps_them_forever(settings):
    _event("tick", age_days=40)
    _event("tock", age_days=40, acked=True)  # EVENT_RETENTION (7 days): goes too
    with override_settings(DISPATCH={**settings.DISPATCH, "EVENT_UNACKED_RETENTION": None}):
        assert get_settings().validate() == []
        events, _ = purge_events_and_runs(get_settings(), db="default", namespace="")
    assert events == 1 and list(Event.objects.values_list("name", flat=True)) == ["tick"]
    events, _ = purge_events_and_runs(get_settings(), db="default", namespace="")
    assert events == 1 and not Event.objects.exists()


@pytest.mark.parametrize("value", [0, -1, "30d"])
def test_a_bad_unacked_retention_is_refused(settings, value):
    with override_settings(DISPATCH={**settings.DISPATCH, "EVENT_UNACKED_RETENTION": value}):
        problems = get_settings().validate()
    assert any("DISPATCH['EVENT_UNACKED_RETENTION']" in p for p in problems), problems


def test_oldest_runnable_age_is_per_namespace(settings):
    settings.TASKS = {
        **settings.TASKS,
        "eu": {**settings.TASKS["default"], "OPTIONS": {"NAMESPACE": "eu"}},
    }
    run = WorkflowRun.objects.create(name="w", namespace="eu")
    WorkflowTask.objects.create(
        run=run,
        namespace="eu",
        name="s",
        sequence=0,
        handler_path="x.y",
        state=StepState.READY,
        ready_at=timezone.now() - timedelta(seconds=120),
    )
    assert oldest_runnable_age() == 0.0
    assert 119 <= oldest_runnable_age(backend="eu") < 600
    with pytest.raises(ValueError, match="TASKS has no DispatchBackend alias 'nope'"):
        oldest_runnable_age(backend="nope")
