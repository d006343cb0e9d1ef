"""The admin's job list across namespaces: the history read one namespace at a time.

The list indexes of finished jobs are led by the namespace, and the admin
shows every namespace: its page merges each namespace's newest finished
jobs (and the live ones) by id. The page, its order, its filters and its
capped count must be those of the one query over the whole table.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from django_dispatch.admin import paging
from django_dispatch.admin.job_parts import job_list_parts
from django_dispatch.models import Job
from django_dispatch.queries.lists import finished_namespaces
from tests.conftest import postgres_only

ADD = "tests.testapp.tasks.add"
ECHO = "tests.testapp.tasks.echo"
NAMESPACES = ["", "a", "b.c"]
STATES = ["succeeded", "failed", "pending", "succeeded", "cancelled", "running", "scheduled"]


def make_jobs(count: int) -> None:
    """Jobs of every state, in three namespaces (one of them rare), two queues, two tasks."""
    Job.objects.bulk_create(
        Job(
            namespace="b.c" if n % 13 == 0 else NAMESPACES[n % 2],
            state=STATES[n % len(STATES)],
            queue_name=("default", "emails")[n % 3 == 0],
            task_path=(ADD, ECHO)[n % 5 == 0],
            args=[],
            kwargs={},
        )
        for n in range(count)
    )


@pytest.mark.django_db
def test_the_namespaces_of_finished_jobs_are_found_in_order():
    assert finished_namespaces("default") == []
    Job.objects.create(namespace="z", task_path=ADD, args=[], kwargs={})  # live: not counted
    make_jobs(60)
    assert finished_namespaces("default") == NAMESPACES


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query",
    [
        {},
        {"p": "2"},
        {"state__exact": "failed"},
        {"state__exact": "pending"},
        {"queue_name": "emails"},
        {"task_path": ECHO},
        {"task_path": ECHO, "p": "2"},
        {"namespace": "b.c"},
        {"namespace": "a", "state__exact": "succeeded"},
    ],
    ids=repr,
)
def test_the_page_and_count_are_those_of_one_query_over_every_namespace(
    admin_client, monkeypatch, query
):
    monkeypatch.setattr(paging.CappedPaginator, "cap", 450)
    make_jobs(1000)
    response = admin_client.get(reverse("admin:django_dispatch_job_changelist"), query)
    assert response.status_code == 200
    cl = response.context["cl"]
    filters = {k.replace("__exact", ""): v for k, v in query.items() if k != "p"}
    expected = list(Job.objects.filter(**filters).order_by("-id").values_list("pk", flat=True))
    page = int(query.get("p", 1))
    assert [j.pk for j in cl.result_list] == expected[(page - 1) * 100 : page * 100]
    assert cl.result_count == min(len(expected), 450)
    assert cl.paginator.capped == (len(expected) > 450)
    # A part per namespace with finished jobs (per namespace and finished state
    # without a filter that an index of their own serves), and the live jobs.
    indexed = {"state__exact", "queue_name", "task_path"} & set(query)
    assert len(cl.paginator.parts) == len(NAMESPACES) * (1 if indexed else 3) + 1


@postgres_only
@pytest.mark.django_db
@pytest.mark.parametrize(
    "filters",
    [{}, {"state": "failed"}, {"queue_name": "emails"}, {"task_path": ECHO}],
    ids=["all", "state", "queue", "task"],
)
def test_each_finished_part_of_an_old_namespace_reads_an_index_led_by_it(filters):
    """20,000 recent jobs in one namespace, 200 old ones in another: each part of
    the old namespace's history is read through an index led by the namespace,
    never the primary key filtered on it (which would read every newer job of
    the other namespace before its first row)."""
    Job.objects.bulk_create(
        (
            Job(
                namespace="old" if n < 200 else "",
                state=("succeeded", "failed", "cancelled")[n % 3],
                queue_name="emails" if n % 7 == 0 else "default",
                task_path=ECHO if n % 11 == 0 else ADD,
                args=[],
                kwargs={},
            )
            for n in range(20_200)
        ),
        batch_size=2000,
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    parts = job_list_parts(Job.objects.filter(**filters))
    old = [part for part in parts if 'namespace" = old' in str(part.query)]
    assert len(old) == (3 if not filters else 1)
    for part in old:
        plan = part.order_by("-id")[:100].explain()
        # Its 200 rows are few: the planner may read them all and sort, through
        # any index led by the namespace; what it must never do is walk the
        # primary key or the table.
        assert "Index Cond: (((namespace)::text = 'old'" in plan, plan
        assert "pkey" not in plan and "Seq Scan" not in plan, plan
