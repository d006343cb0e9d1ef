"""The job and dead letter lists read only the fields their columns show.

A page of 100 jobs built with all 39 columns decoded nine JSON values a
row, most of which only the job's own page shows. The lists now read the
fields their columns name (``list_reads``, ``paging.listed_fields``): the
rows they show must be the very same, and no field left out may be loaded
afterwards, one query per row.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_dispatch.admin.job_columns import STEP_TASK
from django_dispatch.admin.paging import listed_fields
from django_dispatch.models import DeadLetter, Job

ADD = "tests.testapp.tasks.add"


def make_rows(count: int) -> None:
    """Jobs of every kind a column tells apart, and their dead letters."""
    then = timezone.now() - timedelta(days=3)
    jobs = []
    for n in range(count):
        kind = n % 7
        job = Job(
            task_path=STEP_TASK if kind == 6 else ADD,
            queue_name=("default", "emails")[n % 2],
            args=[10**9 + n, n] if kind == 6 else [n, n],
            kwargs={"filler": "x" * 50},
            call_context={"tenant": n},
            enqueued_at=then,
            run_after=then,
            partition_key=f"user:{n % 3}" if kind == 4 else None,
        )
        if kind == 1:
            job.run_after = then + timedelta(days=10)  # deferred
        if kind in (2, 3, 6):
            job.state = "failed" if kind == 2 else "succeeded"
            job.started_at = then + timedelta(seconds=2)
            job.last_attempted_at = then + timedelta(seconds=3)
            job.finished_at = then + timedelta(seconds=4)
            job.attempts = 1
        if kind == 2:
            job.errors = [{"exception_class_path": "builtins.ValueError", "message": f"bad {n}"}]
        if kind == 6:
            job.return_value = {"outcome": "failed"}
        jobs.append(job)
    Job.objects.bulk_create(jobs)
    DeadLetter.objects.bulk_create(
        DeadLetter(
            job_id=job.pk,
            task_path=job.task_path,
            queue_name=job.queue_name,
            args=job.args,
            kwargs=job.kwargs,
            errors=job.errors,
            error_class="builtins.ValueError",
            error_message=f"bad {n} " + "y" * 100,
            enqueued_at=then,
            replayed_at=then if n % 2 else None,
            replay_job_id=job.pk if n % 2 else None,
        )
        for n, job in enumerate(jobs)
    )


def shown(client, model: str) -> tuple[str, list[str]]:
    """The list's table with its times masked (they tick), and the statements it ran."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(f"admin:django_dispatch_{model}_changelist"))
    assert response.status_code == 200
    found = re.search(r'<table id="result_list">.*?</table>', response.content.decode(), re.S)
    assert found is not None
    table = re.sub(r'data-age="[^"]*"', "", found.group(0))
    table = re.sub(r"(<time[^>]*>|<em>)[^<]*", r"\1", table)
    return table, [q["sql"] for q in queries.captured_queries]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "model, table, left_out",
    [("job", Job._meta.db_table, "kwargs"), ("deadletter", DeadLetter._meta.db_table, "args")],
)
def test_a_list_shows_the_same_rows_from_its_columns_fields_only(
    client, login, monkeypatch, model, table, left_out
):
    make_rows(30)
    login(superuser=True)
    narrow, narrow_sql = shown(client, model)
    model_admin = admin.site._registry[Job if model == "job" else DeadLetter]
    monkeypatch.setattr(type(model_admin), "list_reads", {})
    wide, wide_sql = shown(client, model)
    assert narrow == wide
    assert narrow.count('class="action-select"') == 30
    # The page's rows were read without the field; nothing loaded it later
    # (a deferred field read per row would add a statement per row).
    column = f'"{table}"."{left_out}"'
    assert any(column in sql for sql in wide_sql)
    assert not any(column in sql for sql in narrow_sql), narrow_sql
    assert len(narrow_sql) == len(wide_sql)


@pytest.mark.django_db
def test_a_column_no_list_reads_names_makes_the_list_read_every_field(rf, monkeypatch):
    """A subclass's own column may read any field: the list then reads them all."""
    job_admin = admin.site._registry[Job]
    request = rf.get("/")
    fields = listed_fields(job_admin, request)
    assert fields is not None and "errors" in fields and "kwargs" not in fields
    monkeypatch.setattr(type(job_admin), "list_display", [*job_admin.list_display, "priority"])
    assert "priority" in (listed_fields(job_admin, request) or [])  # a field: read it
    monkeypatch.setattr(type(job_admin), "list_display", [*job_admin.list_display, "cost"])
    assert listed_fields(job_admin, request) is None
