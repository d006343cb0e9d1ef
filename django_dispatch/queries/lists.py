"""Jobs, dead letters and workflow runs, listed and counted from code.

The read side of ``django_dispatch.jobs``, ``django_dispatch.dead_letters``
and ``django_dispatch.workflows.list_runs``: newest first (by id, which
grows with time), one namespace (the ``backend`` alias's), paged by keyset
(``before=`` the last id of the previous page), so page N costs what page 1
does. Each filter has an index led by the namespace and ending in the id
(``models.job``, ``models.dead_letter``), so a page reads at most ``limit``
index entries past the ones its filters skip, however long the history.

Jobs are read in two parts, merged: the finished ones through indexes
partial on finished states (the history: millions of rows), the live ones
through one index of live jobs (the claim's and the limits' queries, all on
live jobs, must never find a list index more attractive than their own).

The lists and counts read from ``DISPATCH["READ_DATABASE"]``'s replica when
it is healthy (``queries.reading``): they are what operators page through.
``dead_letter_for_job`` reads the primary: it is asked right after a job
failed, about that one row, which a replica may not have replayed yet.

Bad input raises ``ValueError`` or ``TypeError`` naming the argument and
what it accepts; nothing here writes.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import BooleanField, Model, QuerySet
from django.db.models.expressions import RawSQL

from ..compat import Task
from ..core.states import FINISHED_STATES, LIVE_STATES, JobState
from ..core.workflow_states import RunState
from ..models import DeadLetter, Job, WorkflowRun
from ..store.base import job_sql, using_backend
from ..tasks.registry import namespace_for
from .counting import bounded_count
from .instances import quick
from .reading import read_alias

__all__ = [
    "MAX_LIMIT",
    "dead_letter_for_job",
    "dead_letters_count",
    "dead_letters_list",
    "finished_namespaces",
    "jobs_count",
    "jobs_list",
    "newest_of",
    "runs_count",
    "runs_list",
]

#: The most rows one call returns: past it, page with ``before=``.
MAX_LIMIT = 1000

#: The namespaces that have finished jobs, in order: a loose scan of an index
#: led by the namespace and partial on finished states (``dispatch_job_list_*``),
#: one descent per namespace found, however many rows each holds. The states
#: are the indexes' condition word for word, for SQLite.
FINISHED_NAMESPACES = """
WITH RECURSIVE spaces (namespace) AS (
    SELECT (SELECT namespace FROM {job} WHERE state IN ({finished})
            ORDER BY namespace LIMIT 1)
    UNION ALL
    SELECT (SELECT j.namespace FROM {job} j WHERE j.state IN ({finished})
            AND j.namespace > s.namespace ORDER BY j.namespace LIMIT 1)
    FROM spaces s WHERE s.namespace IS NOT NULL
)
SELECT namespace FROM spaces WHERE namespace IS NOT NULL
"""


def jobs_list(
    *,
    state: str | None = None,
    queue: str | None = None,
    task: Task | str | None = None,
    before: int | str | None = None,
    limit: int = 100,
    backend: str = "default",
) -> list[Job]:
    """The newest ``limit`` jobs of ``backend``'s namespace, newest first.

    ``state``: a ``JobState`` (or its value, ``"failed"``); ``queue``: a
    queue name; ``task``: a Task or its import path; ``before``: a job id
    (a ``TaskResult.id``), to get the page after the one that ended there.
    """
    parts = _job_parts(state=state, queue=queue, task=task, backend=backend)
    if len(parts) == 1:
        return _page(parts[0], before, limit)
    # Each part's newest ids (read off its index), merged in the same
    # statement; only the page's rows are read and built, not every part's.
    _page_limit(limit)
    if before is not None:
        parts = [part.filter(id__lt=_id(before, "before")) for part in parts]
    rows = _jobs(state=state, queue=queue, task=task, backend=backend)
    return list(newest_of(rows, parts, 0, limit))


def newest_of[M: Model](rows: QuerySet[M], parts: list[QuerySet[M]], low: int, high: int) -> Any:
    """Rows ``low`` to ``high`` of ``rows``, newest first by primary key, where
    ``rows`` is the union of ``parts``: one statement.

    ``rows WHERE pk IN (SELECT pk FROM (part 1's newest ``high``) UNION …
    ORDER BY pk DESC LIMIT … OFFSET low)``: each part reads its newest ids
    off its own index (its ``ORDER BY … LIMIT`` a subquery of its own, so the
    planner keeps that plan), and only the page's rows are read whole. One
    round trip, where reading each part's ids apart, then the rows, took one
    per part and one more; and one snapshot, so a row that moved from one
    part to the other (a failed job retried) is seen in one part only
    (UNION, not UNION ALL, for parts that overlap).
    """
    if high <= low:
        return rows.none()
    pk = rows.model._meta.pk
    newest = []
    params: list[Any] = []
    for n, part in enumerate(parts):
        ids = part.order_by(f"-{pk.name}").values_list(pk.name, flat=True)[:high]
        try:
            sql, part_params = ids.query.get_compiler(using=part.db).as_sql()
        except EmptyResultSet:  # a part that matches nothing, such as ``pk__in=[]``
            continue
        newest.append(f"SELECT * FROM ({sql}) AS part{n}")
        params += part_params
    if not newest:
        return rows.none()
    connection = connections[rows.db]
    column = connection.ops.quote_name(pk.column or pk.name)
    union = " UNION ".join(newest)
    page = f"SELECT {column} FROM ({union}) AS parts ORDER BY {column} DESC LIMIT %s OFFSET %s"
    params += [high - low, low]
    if connection.vendor == "postgresql":
        # ``= ANY(ARRAY(…))``: the page's ids are one InitPlan, then one walk
        # of the primary key; ``IN (…)`` is planned as a join of the parts to
        # the table, a third of the statement's planning time.
        table = connection.ops.quote_name(rows.model._meta.db_table)
        on_page = RawSQL(f"{table}.{column} = ANY(ARRAY({page}))", params, BooleanField())
        return quick(rows.filter(on_page).order_by(f"-{pk.name}"))
    page_rows = rows.filter(pk__in=RawSQL(page, params))
    return quick(page_rows.order_by(f"-{pk.name}"))


def finished_namespaces(database: str) -> list[str]:
    """The namespaces that have finished jobs in ``database``, in order.

    What a read across namespaces (the admin's job list) splits the history
    by, so that each part walks an index led by its namespace: namespaces
    are few, and each costs one index descent here, where reading the
    distinct values of the column would read every row.
    """
    connection = connections[database]
    with connection.cursor() as cursor:
        cursor.execute(job_sql(connection, FINISHED_NAMESPACES))
        return [row[0] for row in cursor.fetchall()]


def jobs_count(
    *,
    state: str | None = None,
    queue: str | None = None,
    task: Task | str | None = None,
    backend: str = "default",
    exact: bool = False,
) -> int:
    """How many jobs of ``backend``'s namespace match (the filters of ``jobs_list``).

    The live jobs exactly; the finished ones exactly up to
    ``DISPATCH["COUNT_EXACT_MAX"]``, above that, on PostgreSQL, the
    planner's estimate unless ``exact`` (see ``queries.counting``).
    """
    rows = _jobs(state=state, queue=queue, task=task, backend=backend)
    # Counted in two parts, as pages are read: the history through the
    # indexes partial on finished states, the live jobs through theirs. As
    # one query, a filter on a rare task or queue would scan the history.
    # The live part is never estimated: its statistics go stale as fast as
    # a backlog drains, and its partial indexes hold only the live work.
    wanted = {s for s in JobState.values if state is None or s == state}
    total = 0
    if wanted & set(FINISHED_STATES):
        total += bounded_count(rows.filter(state__in=FINISHED_STATES), exact=exact)
    if wanted & set(LIVE_STATES):
        total += rows.filter(state__in=LIVE_STATES).count()
    return total


def dead_letters_list(
    *,
    task: Task | str | None = None,
    replayed: bool | None = None,
    before: int | str | None = None,
    limit: int = 100,
    backend: str = "default",
) -> list[DeadLetter]:
    """The newest ``limit`` dead letters of ``backend``'s namespace, newest first.

    ``task``: a Task or its import path; ``replayed``: True for those
    replayed, False for those not yet; ``before``: a dead letter id.
    """
    return _page(_dead_letters(task, replayed, backend), before, limit)


def dead_letters_count(
    *,
    task: Task | str | None = None,
    replayed: bool | None = None,
    backend: str = "default",
    exact: bool = False,
) -> int:
    """How many dead letters of ``backend``'s namespace match (about, above
    ``COUNT_EXACT_MAX``, unless ``exact``: see ``jobs_count``)."""
    return bounded_count(_dead_letters(task, replayed, backend), exact=exact)


def dead_letter_for_job(job_id: int | str, *, backend: str = "default") -> DeadLetter | None:
    """The dead letter job ``job_id`` (a ``TaskResult.id``) left, or None.

    A job that failed for good, was retried from the admin and failed again
    has two: the newest is returned.
    """
    pk = _id(job_id, "job_id")
    with using_backend(backend) as db:
        rows = DeadLetter.objects.using(db).filter(namespace=namespace_for(backend), job_id=pk)
    return rows.order_by("-id").first()


def runs_list(
    *,
    state: str | None = None,
    name: str | None = None,
    before: int | str | None = None,
    limit: int = 100,
    backend: str = "default",
) -> list[WorkflowRun]:
    """The newest ``limit`` workflow runs of ``backend``'s namespace, newest first.

    ``state``: a ``RunState`` (or its value, ``"stuck"``); ``name``: the
    workflow's name; ``before``: a run id. A run's steps are ``run.steps``.
    """
    return _page(_runs(state, name, backend), before, limit)


def runs_count(
    *,
    state: str | None = None,
    name: str | None = None,
    backend: str = "default",
    exact: bool = False,
) -> int:
    """How many workflow runs of ``backend``'s namespace match (about, above
    ``COUNT_EXACT_MAX``, unless ``exact``: see ``jobs_count``)."""
    # Every run of the namespace matches: the planner would count them off
    # the table's first pages (read from the OS on every call, past a quarter
    # of shared_buffers); in ``dispatch_wfrun_list_state``'s order the count
    # walks that index instead (see ``queries.counting``). A state or a name
    # already leads the planner to its own index.
    unfiltered = state is None and name is None
    order = ("namespace", "state", "id") if unfiltered else ()
    return bounded_count(_runs(state, name, backend), exact=exact, index_order=order)


# --- the querysets, their arguments checked -------------------------------------------------


def _read[M: Model](model: type[M]) -> QuerySet[M]:
    return model._default_manager.using(read_alias())


def _job_parts(*, state: Any, queue: Any, task: Any, backend: str) -> list[QuerySet[Job]]:
    """``_jobs`` split by the index each part reads (see the module docstring):
    the finished jobs (one part per finished state without a queue or task
    filter, so each walks ``dispatch_job_list_state`` in id order), then the
    live ones."""
    rows = _jobs(state=state, queue=queue, task=task, backend=backend)
    wanted = [s for s in JobState.values if state is None or s == state]
    finished = [s for s in wanted if s in FINISHED_STATES]
    live = [s for s in wanted if s in LIVE_STATES]
    # Each part repeats its index's condition word for word: SQLite uses a
    # partial index only for a query that does (PostgreSQL would infer it).
    history = rows.filter(state__in=FINISHED_STATES)
    parts = []
    if finished and queue is None and task is None:
        parts += [history.filter(state=s) for s in finished]
    elif finished:
        parts.append(history if len(finished) > 1 else history.filter(state=finished[0]))
    if live:
        current = rows.filter(state__in=LIVE_STATES)
        parts.append(current if len(live) > 1 else current.filter(state=live[0]))
    return parts


def _jobs(*, state: Any, queue: Any, task: Any, backend: str) -> QuerySet[Job]:
    with using_backend(backend):  # the alias's database (or its replica)
        rows = _read(Job).filter(namespace=namespace_for(backend))
    if state is not None:
        rows = rows.filter(state=_choice(state, JobState, "state"))
    if queue is not None:
        rows = rows.filter(queue_name=_text(queue, "queue"))
    if task is not None:
        rows = rows.filter(task_path=_task_path(task))
    return rows


def _dead_letters(task: Any, replayed: Any, backend: str) -> QuerySet[DeadLetter]:
    with using_backend(backend):
        rows = _read(DeadLetter).filter(namespace=namespace_for(backend))
    if task is not None:
        rows = rows.filter(task_path=_task_path(task))
    if replayed is not None:
        if not isinstance(replayed, bool):
            raise TypeError(f"replayed must be True, False or None (both), got {replayed!r}.")
        rows = rows.filter(replayed_at__isnull=not replayed)
    return rows


def _runs(state: Any, name: Any, backend: str) -> QuerySet[WorkflowRun]:
    with using_backend(backend):
        rows = _read(WorkflowRun).filter(namespace=namespace_for(backend))
    if state is not None:
        rows = rows.filter(state=_choice(state, RunState, "state"))
    if name is not None:
        rows = rows.filter(name=_text(name, "name"))
    return rows


def _page_limit(limit: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(
            f"limit must be a whole number from 1 to {MAX_LIMIT}, got {limit!r}; "
            "for more rows, ask for the next page with before=<the last id you got>."
        )


def _page(rows: QuerySet[Any], before: Any, limit: Any) -> list[Any]:
    _page_limit(limit)
    if before is not None:
        rows = rows.filter(id__lt=_id(before, "before"))
    return list(quick(rows.order_by("-id")[:limit]))


def _id(value: Any, name: str) -> int:
    """An id given as an int or as the digits of a ``TaskResult.id``."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and int(value) > 0:
        return int(value)
    raise ValueError(
        f"{name} must be an id: a positive whole number or its digits as a string "
        f"(a TaskResult.id), got {value!r}."
    )


def _choice(value: Any, choices: Any, name: str) -> str:
    if value not in choices.values:
        raise ValueError(f"{name} must be one of {list(choices.values)}, got {value!r}.")
    return str(value)


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty string, got {value!r}.")
    return value


def _task_path(task: Any) -> str:
    if isinstance(task, Task):
        return task.module_path
    if isinstance(task, str) and task:
        return task
    raise TypeError(
        "task must be a Task (the function decorated with @task) or its import path "
        f"such as 'shop.tasks.send_welcome', got {task!r}."
    )
