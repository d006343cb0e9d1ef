"""The list pages' model instances (``queries.instances.quick``) are Django's, built faster.

Each instance must hold what ``Model.from_db`` gives it: the same fields in
its ``__dict__``, in the same order, with the same values and types (a JSON
constant a new object each time: a caller may change it), the same
``_state``, and a deferred field still loaded on first access. Where the
shortcut could differ (a related or annotated select, a model with
``post_init`` receivers) Django's own iterable builds the rows.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from django.db.models.query import ModelIterable
from django.db.models.signals import post_init
from django.test.utils import isolate_apps
from django.utils import timezone

from django_dispatch import dead_letters, jobs, workflows
from django_dispatch.models import DeadLetter, Job, WorkflowRun, WorkflowTask
from django_dispatch.queries.instances import MIRRORED, QuickRows, plain, quick

ADD = "tests.testapp.tasks.add"

pytestmark = pytest.mark.django_db


def make_jobs() -> None:
    then = timezone.now() - timedelta(hours=1)
    values: list[tuple[Any, Any, Any]] = [
        ([], {}, None),
        ([1, 2], {"a": [1, {"b": None}]}, {"outcome": "failed"}),
        ([], {}, []),
        ([None], {"x": "[]"}, "{}"),  # strings that look like constants stay strings
        ([True], {}, 0),
        ([], {"k": "ü"}, False),
        ([], {}, True),
    ]
    rows = []
    for n, (args, kwargs, result) in enumerate(values * 3):
        job = Job(task_path=ADD, args=args, kwargs=kwargs, enqueued_at=then, run_after=then)
        if n % 2:
            job.state = "failed" if n % 4 == 1 else "succeeded"
            job.finished_at, job.return_value = then, result
            job.errors = [{"exception_class_path": "builtins.ValueError", "message": "no"}]
        rows.append(job)
    Job.objects.bulk_create(rows)


def same(django: list[Any], ours: list[Any]) -> None:
    assert len(django) == len(ours) > 0
    for a, b in zip(django, ours, strict=True):
        assert type(a) is type(b)
        assert list(a.__dict__) == list(b.__dict__)  # the same fields, in the same order
        for name, value in a.__dict__.items():
            if name == "_state":
                assert vars(value) == vars(b._state)
                continue
            assert value == b.__dict__[name], name
            assert type(value) is type(b.__dict__[name]), name


def test_jobs_built_as_django_builds_them() -> None:
    make_jobs()
    rows = Job.objects.order_by("-id")
    same(list(rows), list(quick(rows)))
    # Only on the Django whose internals it mirrors; any other builds Django's way.
    assert (quick(rows)._iterable_class is QuickRows) is MIRRORED
    values = rows.values_list("id", flat=True)
    assert list(quick(values)) == list(values)  # not instances: left as they are
    assert quick(rows.values("id"))._iterable_class is not QuickRows
    only = rows.only("id", "state", "args", "finished_at")
    same(list(only), list(quick(only)))


def test_constants_are_new_objects_each_time() -> None:
    make_jobs()
    first, second = (list(quick(Job.objects.filter(args=[]).order_by("id"))) for _ in (1, 2))
    first[0].args.append(1)
    first[0].kwargs["a"] = 1
    assert first[1].args == [] and first[1].kwargs == {}
    assert second[0].args == [] and second[0].kwargs == {}
    assert first[0].args is not first[1].args


def test_a_deferred_field_loads_on_access() -> None:
    make_jobs()
    row = quick(Job.objects.only("id").order_by("id"))[0]
    assert "kwargs" not in row.__dict__
    assert row.kwargs == Job.objects.get(pk=row.pk).kwargs


def test_related_annotated_and_observed_selects_are_djangos() -> None:
    make_jobs()
    annotated = Job.objects.annotate(twice=F("attempts") * 2).order_by("id")
    assert [j.twice for j in quick(annotated)] == [j.twice for j in annotated]
    run = WorkflowRun.objects.create(name="signup", state="running")
    WorkflowTask.objects.create(run=run, name="a", sequence=0)
    related = WorkflowTask.objects.select_related("run")
    tasks = list(quick(related))
    # Joined, not loaded later one query per row.
    assert all(WorkflowTask._meta.get_field("run").is_cached(t) for t in tasks)
    assert [t.run.name for t in tasks] == ["signup"]
    seen: list[Any] = []

    def saw(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(saw, sender=Job)
    try:
        rows = list(quick(Job.objects.order_by("id")))
    finally:
        post_init.disconnect(saw, sender=Job)
    assert seen == rows  # built by Django: the receiver saw every row


def test_list_functions_return_djangos_instances() -> None:
    make_jobs()
    failed = Job.objects.filter(state="failed").first()
    assert failed is not None
    DeadLetter.objects.create(
        job_id=failed.pk,
        task_path=ADD,
        error_class="builtins.ValueError",
        error_message="no",
        enqueued_at=timezone.now(),
    )
    WorkflowRun.objects.create(name="signup", state="stuck", input={"a": [1]})
    same(list(Job.objects.order_by("-id")), jobs.list())
    same(list(Job.objects.filter(state="failed").order_by("-id")), jobs.list(state="failed"))
    same(list(DeadLetter.objects.order_by("-id")), dead_letters.list())
    same(list(WorkflowRun.objects.order_by("-id")), workflows.list_runs())


class Remembers:
    """A mixin after ``Model``: reached by ``Model.__init__``'s ``super().__init__()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.remembered = True


@isolate_apps("django_dispatch")
def test_a_model_with_its_own_init_or_setattr_is_built_by_django() -> None:
    class RemembersJob(Job, Remembers):
        class Meta:
            proxy = True
            app_label = "django_dispatch"

    class TracksJob(Job):
        class Meta:
            proxy = True
            app_label = "django_dispatch"

        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)

    assert plain(Job)
    assert not plain(RemembersJob)
    assert not plain(TracksJob)


@pytest.mark.skipif(not MIRRORED, reason="the quick path runs on Django 6.1 only")
def test_a_plain_select_of_jobs_takes_the_quick_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not Django's fallback: else a change that disabled the quick path would
    pass every comparison above, and lose its speed unseen."""
    make_jobs()

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("built Django's way")

    monkeypatch.setattr(QuickRows, "_built", refused)
    monkeypatch.setattr(ModelIterable, "__iter__", refused)  # the first fallback
    assert len(list(quick(Job.objects.order_by("id")))) == Job.objects.count()
