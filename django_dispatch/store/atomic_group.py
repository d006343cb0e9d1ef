"""A group of atomic jobs in one transaction: the savepoints between their bodies, and
their successes written with the COMMIT, in one round trip.

A job thread that runs atomic jobs back to back keeps one transaction open
across several of them (``runtime.atomic_group``). Alone, each atomic job is a
writing transaction of its own: a commit that waits for its WAL flush, and a
success UPDATE of its own, where a wave of plain successes shares one of each
among many jobs.

``member_savepoint``: before a member's body, a savepoint when the transaction
already holds what earlier members wrote, so that a body that fails is undone
alone (``member_undo``). None when no transaction is open yet: nothing is
there to keep, and rolling the whole transaction back undoes that member only.

``commit_successes_if_leased``: every member's fenced success and usage record
by the wave's own function (``django_dispatch_finish_wave``, planned once per
server session, its rows locked in id order as the heartbeat's renewal locks
them), then the COMMIT, in one query (``atomic_finish.commit_if_fenced``). The
group commits only if every member's fence held: when fewer won than were sent,
the cast of a text naming the loss fails (SQLSTATE 22P02, with ``LOST`` in its
message, as the lone atomic success's function raises), and the server skips
the COMMIT. The text depends on the result, so the planner cannot fold it
(and raise) before the finish has run.

PostgreSQL on psycopg 3 only, and unkeyed jobs only: the caller checks with
``atomic_finish.fast_path_available``. All by libpq, past Django's cursor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import InterfaceError, connections

from .atomic_finish import LOST, commit_if_fenced
from .finish import MeasuredUsage, finish_params
from .types import Lease

#: The members' savepoint: one name, each new one hiding the last (a rollback
#: to it undoes only the member that took it).
_SAVEPOINT = b"SAVEPOINT django_dispatch_member"
_ROLLBACK_TO = b"ROLLBACK TO SAVEPOINT django_dispatch_member"

#: The group's finish (``%d``: how many were sent); the casts pick the
#: function's signature, as ``store.wave``'s call does.
_GROUP_SQL = (
    b"SELECT CASE WHEN cardinality(f.won) = %d THEN 0 ELSE ('"
    + LOST.encode()
    + b" ' || coalesce(cardinality(f.won), 0))::integer END"
    b" FROM django_dispatch_finish_wave(%b::bigint[], %b::text[], %b::bigint[], %b::jsonb[],"
    b" %b::boolean[], %b::float8[], %b::float8[], %b::float8[], %b::text, %b::text) AS f"
)
_ARRAYS = ("ids", "workers", "epochs", "values")
_USAGE = ("metered", "walls", "cpus", "rss", "host", "outcome")


def member_savepoint(db: str) -> bool:
    """Before a member's body, in the group's open ``atomic`` block: True when a
    savepoint was taken (the transaction holds earlier members' writes)."""
    from psycopg import pq

    connection = connections[db]
    connection.ensure_connection()
    if connection.connection.pgconn.transaction_status == pq.TransactionStatus.IDLE:
        return False
    _exec(connection, _SAVEPOINT)
    return True


def backend_pid(db: str) -> int | None:
    """The server process of ``db``'s connection on this thread (None: not open)."""
    raw = connections[db].connection
    return None if raw is None else raw.info.backend_pid


#: Only a server process of this database and role with a transaction open:
#: behind a pooler the pid a client was given is the pooler's own (PgBouncer
#: sends a random one), which must not end anything else.
_END_BACKEND_SQL = """
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE pid = %s AND datname = current_database() AND usename = current_user
    AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
"""


def end_backend(db: str, pid: int) -> None:
    """End a stuck group's server process (from another thread's connection):
    its transaction rolls back and its locks go. Behind a pooler in transaction
    mode the pid is not the server's, and nothing is ended: the locks then last
    until the stuck body returns, as a lone atomic job's do."""
    with connections[db].cursor() as cursor:
        cursor.execute(_END_BACKEND_SQL, [pid])


def read_committed(db: str) -> bool:
    """Whether ``db``'s transactions run at READ COMMITTED (Django's default):
    each statement then takes its own snapshot, so a member never reads what
    the group's first statement saw."""
    from psycopg import IsolationLevel

    level = getattr(connections[db], "isolation_level", None)
    return level in (None, IsolationLevel.READ_COMMITTED)


def aborted(db: str) -> bool:
    """Whether the group's transaction is failed (a body caught a database error
    outside a savepoint of its own): nothing more can run or commit in it."""
    from psycopg import pq

    raw = connections[db].connection
    return raw is not None and raw.pgconn.transaction_status == pq.TransactionStatus.INERROR


def member_undo(db: str, savepoint: bool) -> None:
    """After a member's body that must keep nothing: back to its savepoint, or,
    without one, the whole transaction (which then held only that member's)."""
    from psycopg import pq

    connection = connections[db]
    raw = connection.connection
    if raw is None:  # closed by the body or by Django after a lost connection
        raise InterfaceError(f"the connection to {db!r} was closed")
    if savepoint:
        _exec(connection, _ROLLBACK_TO)
    elif raw.pgconn.transaction_status != pq.TransactionStatus.IDLE:
        _exec(connection, b"ROLLBACK")


def commit_successes_if_leased(
    results: Sequence[tuple[Lease, Any]], usage: MeasuredUsage | None, *, db: str
) -> bool:
    """In the group's open ``atomic`` block: every member's success (and usage
    record), fenced, and COMMIT. True: all committed. False: a fence failed,
    nothing is committed, and the block is left for the caller to roll back."""
    params = finish_params(results, usage)

    def render(text: Callable[[str | None], bytes]) -> bytes:
        values = [text(params[name]) for name in _ARRAYS]
        values += [text(params[name]) for name in _USAGE] if usage else [b"NULL"] * len(_USAGE)
        return _GROUP_SQL % (len(results), *values)

    return commit_if_fenced(db, render)


def _exec(connection: Any, sql: bytes) -> None:
    """One statement of ours by libpq; a failure raised as Django's error would be."""
    from psycopg import errors, pq

    raw = connection.connection
    pgconn = raw.pgconn
    with connection.wrap_database_errors:
        result = pgconn.exec_(sql)
        if result.status == pq.ExecStatus.COMMAND_OK:
            return
        encoding = raw.info.encoding
        if pgconn.status != pq.ConnStatus.OK:
            raise errors.OperationalError(
                pgconn.get_error_message(encoding) or "the connection was lost"
            )
        raise errors.error_from_result(result, encoding=encoding)
