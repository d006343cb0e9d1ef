"""The admin's job list in parts, each read through an index of its own.

The list shows every namespace, and the indexes of finished jobs of a state,
a queue or a task (``dispatch_job_list_*``) are led by the namespace, as
``jobs.list`` reads one namespace. Indexes of the same columns without the
namespace would serve this one page, and cost every job three more index
entries when it finishes (a state change is never a HOT update). So the
list reads its history one namespace at a time and merges the parts' newest
ids (``paging.merged_rows``): namespaces are few, and found by one index
descent each (``queries.lists.finished_namespaces``).
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import QuerySet

from ..core.states import FINISHED_STATES, LIVE_STATES
from ..models import Job
from ..queries.lists import finished_namespaces

#: The filters that lead a part to an index of its own
#: (``dispatch_job_list_state``, ``_queue``, ``_task``).
INDEXED_FILTERS = frozenset({"state", "queue_name", "task_path"})


def job_list_parts(queryset: QuerySet[Job]) -> list[QuerySet[Job]]:
    """The finished jobs of ``queryset``, by namespace, then its live jobs.

    The finished parts hold the history (millions of rows), read through
    the list indexes, which hold finished jobs only: a page of a rare queue
    reads its entries, newest first, where one query over every state would
    read the whole history until its page is full. The live jobs are few,
    and indexed apart.
    """
    finished = queryset.filter(state__in=FINISHED_STATES)
    # Without a filter an index serves, a namespace is read state by state:
    # each part is then a walk of ``dispatch_job_list_state`` in id order,
    # where the primary key, filtered on a namespace whose rows are all old,
    # would read every newer row of the others to fill its page.
    split = not INDEXED_FILTERS & compared_fields(queryset.query.where)
    # A state part repeats the indexes' condition for SQLite, which uses a
    # partial index only for a query that says it word for word; PostgreSQL
    # infers it from the state, and each clause it need not prove against
    # the table's partial indexes is planning time saved, per part.
    infers = connections[queryset.db].vendor == "postgresql"
    parts = []
    for space in finished_namespaces(queryset.db):
        part = finished.filter(namespace=space)
        if not split:
            parts.append(part)
            continue
        of_space = queryset.filter(namespace=space) if infers else part
        parts += [of_space.filter(state=s) for s in FINISHED_STATES]
    return [*parts, queryset.filter(state__in=LIVE_STATES)]


def compared_fields(node: Any) -> set[str]:
    """The fields a query's WHERE (or a node of it) compares, at any depth."""
    if hasattr(node, "children"):
        return set().union(*(compared_fields(child) for child in node.children))
    target = getattr(getattr(node, "lhs", None), "target", None)
    return {target.name} if target is not None else set()
