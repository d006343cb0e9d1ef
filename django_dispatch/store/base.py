"""Helpers shared by the store's modules."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import (
    BooleanField,
    DateTimeField,
    ExpressionWrapper,
    Q,
    QuerySet,
    Value,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from ..conf import size_limit
from ..core.limits import truncate_error_text
from ..core.states import FINISHED_STATES, LIVE_STATES, WAITING_STATES, JobState
from ..models import Job
from ..models.job import NAMESPACE_RE

# Re-exported: the database routing by alias (``store.routing``), where every
# module has always found ``db_alias``.
from .routing import caller_database as caller_database
from .routing import carrying_database as carrying_database
from .routing import database_for as database_for
from .routing import db_alias as db_alias
from .routing import read_database_for as read_database_for
from .routing import routed_database as routed_database
from .routing import serve_database as serve_database
from .routing import using_backend as using_backend
from .routing import using_database as using_database

NOTIFY_CHANNEL = "django_dispatch"


def notify_channel(namespace: str = "") -> str:
    """The LISTEN/NOTIFY channel of ``namespace``'s idle workers.

    ``NOTIFY_CHANNEL`` for the default namespace (what a site without
    namespaces listens on), and
    a channel per namespace otherwise, so a job in one namespace never wakes
    an idle worker of another. A hash, not the name: a channel is an
    identifier of at most 63 bytes and a namespace may contain ``.``/``:``.
    The insert trigger (migration 0008) computes the same name in SQL.
    """
    if not namespace:
        return NOTIFY_CHANNEL
    return f"{NOTIFY_CHANNEL}_{hashlib.md5(namespace.encode()).hexdigest()[:16]}"


def namespace_literal(namespace: str) -> str:
    """``namespace`` as a SQL string literal, for raw statements.

    A literal rather than a parameter, like the states (see ``job_sql``), so
    that the planner matches it to the indexes led by the namespace, and so
    that the statements keep their parameters. Safe because a namespace has
    no quote: anything else is refused here, whatever wrote the setting.
    """
    if not NAMESPACE_RE.fullmatch(namespace):
        raise ValueError(
            f"namespace {namespace!r} is not valid: at most 63 letters, digits, "
            "'_', '-', '.' or ':' (run `manage.py check`)."
        )
    return f"'{namespace}'"


class _LeaveOthers(dict[str, str]):
    """Format mapping that leaves a placeholder it does not know as it was."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


#: Rendered raw statements, by (template, database vendor).
_RENDERED: dict[tuple[str, str], str] = {}


def sql_names(connection: Any) -> dict[str, str]:
    """The names raw SQL on the job table takes from the models.

    ``job``: ``Job._meta.db_table``, quoted by the database's own
    ``quote_name``; one entry per ``JobState`` (``pending``, ``blocked``, ...):
    its value as a SQL string literal; ``live`` and ``finished``: the lists of
    the partial indexes' conditions (``LIVE_STATES``, ``FINISHED_STATES``, in
    their order, for ``state IN ({live})``). So a renamed table or state cannot
    leave a raw statement behind: the ORM and the raw SQL read one source.
    """
    names = {"job": connection.ops.quote_name(Job._meta.db_table)}
    for state in JobState:
        assert "'" not in state.value  # a literal, not a parameter: keep it plain
        names[state.name.lower()] = f"'{state.value}'"
    names["live"] = ", ".join(names[state.name.lower()] for state in LIVE_STATES)
    names["finished"] = ", ".join(names[state.name.lower()] for state in FINISHED_STATES)
    return names


def job_sql(connection: Any, template: str) -> str:
    """``template`` with ``sql_names`` filled in for ``connection``'s database.

    Raw statements are written with ``{job}`` for the job table and
    ``{pending}``, ``{running}``, ... for the states; any other placeholder
    (``{ids}``, ``{filters}``, ...) is left for the caller's own ``format``.
    States go in as literals, not parameters, so that the planner matches
    them to the partial indexes (``state = 'pending'`` for the claim index).
    Rendered once per template and database vendor; later calls are one
    dictionary lookup, so the hot paths pay nothing for it.
    """
    key = (template, connection.vendor)
    sql = _RENDERED.get(key)
    if sql is None:
        sql = _RENDERED[key] = template.format_map(_LeaveOthers(sql_names(connection)))
    return sql


def hot_cursor(connection: Any) -> Any:
    """A cursor for the worker's hot statements (the claim, a wave's finish) on PostgreSQL.

    Django's default psycopg cursor binds parameters on the client: psycopg
    quotes each into the SQL text (a wave's arrays of ids, epochs and
    values), a measurable part of a wave's Python, and such a statement can
    never be prepared. This one binds them on the server, so a statement
    the worker runs over and over is prepared once per session when the
    site allows prepared statements (``OPTIONS["prepare_threshold"]``,
    psycopg's switch, which Django leaves off because a pooler in
    transaction mode cannot track them), and is then not planned again:
    planning was about 40% of the claim statement's server time. Without
    the switch nothing is prepared, and only the binding changes. Still a
    Django cursor: errors are wrapped, execute wrappers and the query log
    see it, and it takes part in the connection's transaction.
    """
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:  # psycopg2 binds on the client whatever the cursor
        return connection.cursor()
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        # django-stubs declare the class without psycopg's arguments.
        cursor = ServerBindingCursor(connection.connection)  # type: ignore[call-arg]
        if settings.USE_TZ and connection.timezone_name == "UTC":
            # Django loads each timestamptz through a Python wrapper that sets
            # the tzinfo Django wants; with the session in UTC (USE_TZ), psycopg's
            # own loader (C) gives the very same value: timezone.utc. A claimed
            # row has five, about 5% of a drain's worker CPU through the wrapper.
            cursor.adapters.register_loader("timestamptz", _timestamptz_loader())  # type: ignore[attr-defined]
        return connection._prepare_cursor(cursor)


def _timestamptz_loader() -> Any:
    """psycopg's own text loader of timestamptz (its C one with psycopg[binary])."""
    import psycopg
    from psycopg.pq import Format

    return psycopg.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, Format.TEXT)


#: The order in which jobs are claimed (the claim indexes' order): highest
#: priority first, then the earliest due, then the oldest. Set-aside jobs of a
#: limited group or queue are promoted in it too (``store.flow``).
CLAIM_ORDER = ("-priority", "run_after", "id")


def state_in(states: Sequence[str]) -> RawSQL:
    """``state IN (...)`` with the states as SQL literals, in the given order: a
    filter for ORM queries that must read a partial index whose condition is an
    ``IN`` list (``LIVE_STATES``, ``FINISHED_STATES``). SQLite uses a partial
    index only for a query that repeats each term of its condition, and
    ``state__in`` (or ``state=``) sends bound parameters, which match no ``IN``
    list: without it, such a query reads the whole job table on SQLite.
    """
    for state in states:
        assert "'" not in state  # a literal, not a parameter: keep it plain
    listed = ", ".join(f"'{state}'" for state in states)
    return RawSQL(f"state IN ({listed})", (), output_field=BooleanField())


#: Live jobs, state by state, each as one predicate per partial index whose
#: condition it implies, so that PostgreSQL ORs index scans instead of reading
#: the table, finished rows and all (SQLite: a MULTI-INDEX OR). Pending jobs
#: are split between the two claim indexes (jobs with resource needs apart,
#: Blocked jobs wait behind their partition's head, or are set aside by
#: a concurrency or rate limit of their task (``concurrency_key``) or
#: their queue (``flow_queue``); a job matching two is counted once.
#: Each arm repeats the whole condition of its index: SQLite (3.40) matches a
#: partial index to the terms of one ``OR`` arm only.
LIVE_JOBS_BY_STATE: dict[JobState, Q] = {
    JobState.PENDING: Q(state=JobState.PENDING, resource_shape__isnull=True)
    | Q(state=JobState.PENDING, resource_shape__isnull=False),
    JobState.BLOCKED: Q(state_in(LIVE_STATES), state=JobState.BLOCKED, partition_key__isnull=False)
    | Q(state_in(LIVE_STATES), state=JobState.BLOCKED, concurrency_key__isnull=False)
    | Q(state_in(WAITING_STATES), state=JobState.BLOCKED, flow_queue__isnull=False),
    JobState.RUNNING: Q(state=JobState.RUNNING),
    # Deferred jobs: the stager's index (``dispatch_job_scheduled``).
    JobState.SCHEDULED: Q(state=JobState.SCHEDULED),
}


def live_jobs() -> Q:
    """Every live job, through the partial indexes (``LIVE_JOBS_BY_STATE``): the
    filter of a count of live jobs, whose cost then follows the backlog, not
    the table's history.

    ``namespace >= ''`` holds for every row; it is there for the counts of
    every namespace at once (the cluster gauges, a system check): every index
    of the ``OR`` leads with the namespace, and SQLite scans each arm's index
    only with a constraint on its first column, else it reads the table.
    """
    pending, blocked, running, scheduled = (LIVE_JOBS_BY_STATE[state] for state in LIVE_STATES)
    return Q(namespace__gte="") & (pending | blocked | running | scheduled)


def pending_priorities(db: str, namespace: str, shape: int | None) -> Iterator[int]:
    """The distinct priorities of ``namespace``'s pending jobs of ``shape`` (None:
    jobs without needs), highest first, one index descent each.

    Those jobs are one index range led by the namespace (and the shape), then
    ``priority`` (``dispatch_job_claim``, ``dispatch_job_claim_shaped``).
    A loose index scan, which PostgreSQL 15 lacks and SQLite does only with
    statistics: the resource-aware claim (``sources.resources``) walks the
    priorities with it to merge its sources' index ranges in claim order, and
    ``claim.jobs_due_exist`` to probe each shape the worker could hold.
    """
    pending = Job.objects.using(db).filter(namespace=namespace, state=JobState.PENDING)
    if shape is None:
        pending = pending.filter(resource_shape__isnull=True)
    else:
        pending = pending.filter(resource_shape=shape)
    below: int | None = None
    while True:
        lower = pending if below is None else pending.filter(priority__lt=below)
        below = lower.order_by("-priority").values_list("priority", flat=True).first()
        if below is None:
            return
        yield below


def now_plus(seconds: float) -> Now | ExpressionWrapper:
    """``now() + seconds`` on the database clock.

    ``now()`` itself for 0: on SQLite, ``now()`` is text to the millisecond
    and the sum is text to the microsecond, compared as text, so "now + 0"
    written in one millisecond sorted after ``now()`` read in that same
    millisecond, and an expiry of "now" was not yet due there.
    """
    if not seconds:
        return Now()
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def notify(db: str, namespace: str = "") -> None:
    """Wake ``namespace``'s idle PostgreSQL workers (delivered when the transaction commits)."""
    connection = connections[db]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [notify_channel(namespace)])


def db_now(db: str) -> datetime:
    """The database clock, as an aware datetime."""
    connection = connections[db]
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'NOW')")
            return datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)
        cursor.execute("SELECT CURRENT_TIMESTAMP")
        return cursor.fetchone()[0]


def take_sqlite_write_lock(db: str) -> None:
    """Start the current SQLite transaction as a writer.

    SQLite has no row locks; a deferred transaction that read, then tries to
    write, fails if another writer got in between. Writing first (a no-op
    UPDATE) takes the database's write lock up front, waiting up to the
    connection's timeout, so such transactions are serialized instead.
    """
    if connections[db].vendor == "sqlite":
        Job.objects.using(db).filter(pk=0).update(lease_epoch=0)


def error_entry(
    exception_class_path: str, message: str, traceback: str, code: str | None = None
) -> dict[str, str]:
    """The JSON shape of one attempt's error, as stored in ``Job.errors``.

    ``code`` (``core.failures.error_code``; the class path when not given)
    is what to group failures by. The message and the traceback are each cut
    to ``DISPATCH["MAX_ERROR_BYTES"]`` (start and end kept; see
    ``core.limits.truncate_error_text``): an error is never refused, however
    big, since refusing it would lose the failure.
    """
    limit = size_limit("MAX_ERROR_BYTES")
    return {
        "exception_class_path": exception_class_path,
        "code": code or exception_class_path,
        "message": truncate_error_text(message, limit),
        "traceback": truncate_error_text(traceback, limit),
    }


def delete_in_batches(old: QuerySet[Any], order_by: str, *, batch: int, max_seconds: float) -> int:
    """Delete the rows of ``old``, oldest ``order_by`` first, ``batch`` at a time;
    return how many rows of its model were deleted.

    Why batches: each is its own short DELETE, so no purge holds locks for
    long beside a busy worker; they repeat until none is left or
    ``max_seconds`` pass (the leader's purges share its time). Safe with
    several purgers: a row deleted twice is deleted once.
    """
    model, db = old.model, old.db
    deleted = 0
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        ids = list(old.order_by(order_by).values_list("id", flat=True)[:batch])
        if not ids:
            break
        _, per_model = model._default_manager.using(db).filter(id__in=ids).delete()
        deleted += per_model.get(model._meta.label, 0)
        if len(ids) < batch:
            break
    return deleted
