"""An atomic job's fenced success and its commit, sent together: one round trip.

An atomic task's body runs in a transaction that its job's success must
commit (``runtime.atomic``). Written as any success is (``jobs_finish_many_if_leased``
for a wave of one, then Django's COMMIT), an atomic no-op costs three round
trips, each a wake-up of both the worker and the server: BEGIN (psycopg
sends it before the first statement), the fenced write, COMMIT. A wave of
plain jobs shares them among hundreds of jobs; an atomic job cannot.

``job_commit_success_if_leased`` sends the fenced UPDATE, the usage record
and the COMMIT as one simple-protocol query (``SELECT f(...); COMMIT``);
when the body wrote nothing the transaction is not open yet, and the call
runs alone, its own implicit transaction. It goes by libpq, past Django's
cursor: ``connection.queries`` and ``execute_wrapper``s do not see it.

The write itself is the PL/pgSQL function of migration 0026
(``django_dispatch_atomic_success``). It runs once per job, and nothing is
prepared (Django's default, and all that PgBouncer in transaction mode
passes): sent as SQL, the statement would be parsed, analysed and planned
on every job, the planner weighing each of the job table's 21 indexes, most
of an atomic job's server time. The function's statements are planned once
per server session; the call is a plain statement, cheap to plan, and
passes PgBouncer as any other.

The fence must stop the COMMIT that follows it in the same query, which the
client never gets to decide on: when the UPDATE matched no row, the function
raises, the server skips the rest of the query, and the transaction is left
aborted for the caller to roll back. The error is recognised by its SQLSTATE
(22P02, which no statement of ours raises otherwise) and ``LOST``.

PostgreSQL on psycopg 3 and unkeyed jobs only (``fast_path_available``): a
keyed job's success takes its partition's lock before the UPDATE and promotes
the next job after it, which the wave's path does; psycopg 2 and SQLite take
that path too. Through PgBouncer in transaction mode a simple query with a
COMMIT in it is an ordinary transaction; nothing is prepared.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

from django.db import connections
from django.db.transaction import TransactionManagementError

from .types import Lease
from .usage import UsageEntry

#: What the lost fence's error says, in the server's log and in the error.
LOST = "django_dispatch: lease lost, success rolled back"
#: invalid_text_representation: the SQLSTATE the function raises it with.
_LOST_SQLSTATE = "22P02"

#: The fenced success and its usage record, by the function of migration
#: 0026 (its statements planned once per server session). ``%s::boolean``:
#: whether to write the record; the last five: what the worker alone knows
#: of it (NULL without a record). The casts pick the function's signature.
_SUCCESS_SQL = (
    b"SELECT django_dispatch_atomic_success(%b::bigint, %b::text, %b::bigint, %b::jsonb,"
    b" %b::boolean, %b::text, %b::text, %b::float8, %b::float8, %b::float8)"
)
_NO_RECORD = [b"false", b"NULL", b"NULL", b"NULL", b"NULL", b"NULL"]
#: Why an atomic body's writes were not kept when it marked them for rollback.
MARKED_FOR_ROLLBACK = (
    "the atomic task's transaction was marked for rollback "
    "(transaction.set_rollback(True), or a database error caught inside it): "
    "its writes are rolled back and this attempt fails. To end a job without "
    "keeping its writes, raise an exception from the task instead."
)


def fast_path_available(db: str, lease: Lease) -> bool:
    """Whether ``job_commit_success_if_leased`` can write this job's success."""
    if lease.partition_key:
        return False
    connection = connections[db]
    return connection.vendor == "postgresql" and _is_psycopg3()


@functools.cache
def _is_psycopg3() -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3


def job_commit_success_if_leased(
    lease: Lease, return_value: Any, usage: UsageEntry | None, *, db: str
) -> bool:
    """Inside an open ``atomic`` block on ``db``: running -> succeeded, fenced, and COMMIT.

    True: the success, ``usage`` and whatever the transaction wrote before are
    committed (Django's own commit at the end of the block then has nothing
    left to do). False: the fence matched no row (cancelled, timed out or
    reclaimed meanwhile), nothing is committed, and the transaction is left
    for the caller to roll back. Any other error is raised, nothing committed.
    Call it last in the transaction: it commits.

    Sent by libpq itself (``PQexec``, which releases the GIL while it waits),
    not through a cursor: one statement of our own whose only result is its
    error or its absence needs none of a cursor's machinery (adapters,
    result loaders, psycopg's transaction start, toggling autocommit when the
    body wrote nothing), which cost the job thread more than the round trip.
    The values go as literals escaped by libpq for the connection's encoding
    (``PQescapeLiteral``): the simple protocol that carries ``; COMMIT`` has
    no parameters.
    """

    def render(text: Callable[[str | None], bytes]) -> bytes:
        args = [
            b"%d" % lease.job_id,
            text(lease.worker_id),
            b"%d" % lease.epoch,
            text(None if return_value is None else json.dumps(return_value)),
        ]
        if usage is None:
            args += _NO_RECORD
        else:  # the rest of the record comes from the row
            args += [b"true", text(usage.host), text(usage.outcome)]
            args += [_float(x) for x in (usage.wall_seconds, usage.cpu_seconds, usage.peak_rss_mb)]
        return _SUCCESS_SQL % tuple(args)

    return commit_if_fenced(db, render)


def commit_if_fenced(db: str, render: Callable[[Callable[[str | None], bytes]], bytes]) -> bool:
    """Inside an open ``atomic`` block on ``db``: a fenced write and COMMIT, one round trip.

    ``render(text)`` builds the write (``text`` escapes a value as a literal,
    None as NULL); it must raise ``LOST`` (SQLSTATE 22P02) when its fence
    matches nothing. True: committed. False: the fence was lost, nothing is
    committed, and the transaction is left for the caller to roll back. Any
    other error is raised, nothing committed.
    """
    from psycopg import errors, pq

    connection = connections[db]
    # A body that marked its transaction for rollback (``set_rollback(True)``,
    # or a database error caught inside a savepoint-less ``atomic``) must
    # commit nothing: a cursor would refuse the statement, but this call
    # sends its COMMIT past Django's cursor, so it checks first.
    if connection.needs_rollback:
        raise TransactionManagementError(MARKED_FOR_ROLLBACK)
    connection.ensure_connection()  # the job thread checked it before the body
    raw = connection.connection
    pgconn = raw.pgconn
    # The body wrote nothing: psycopg has not sent BEGIN yet, and the call is
    # its own transaction; else its COMMIT goes with it.
    idle = pgconn.transaction_status == pq.TransactionStatus.IDLE
    encoding = raw.info.encoding
    escape = pq.Escaping(pgconn).escape_literal

    def text(value: str | None) -> bytes:
        return b"NULL" if value is None else escape(value.encode(encoding))

    sql = render(text)
    if not idle:
        sql += b";\nCOMMIT"
    with connection.wrap_database_errors:
        result = pgconn.exec_(sql)
        if result.status in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            return True
        if pgconn.status != pq.ConnStatus.OK:
            raise errors.OperationalError(
                pgconn.get_error_message(encoding) or "the connection was lost"
            )
        error = errors.error_from_result(result, encoding=encoding)
        if error.sqlstate == _LOST_SQLSTATE and LOST in str(error):
            return False
        raise error


@contextlib.contextmanager
def begin_with_first_statement(db: str) -> Iterator[None]:
    """Inside a just-opened ``atomic`` block on ``db``: its BEGIN rides its first statement.

    psycopg opens the transaction with a BEGIN of its own, one round trip
    (a wake-up of the job thread and of the server) before the body's first
    statement. Here that statement, if it goes through a Django cursor with
    client-side binding (Django's default, sent by the simple protocol that
    takes several statements), is sent as ``BEGIN; <statement>`` and its
    result is the one the cursor shows. Anything else that starts the
    transaction (a raw psycopg cursor, a COPY, ``executemany``, a named
    cursor, a server-side binding) still gets psycopg's own BEGIN first:
    no statement of the block ever runs outside its transaction. Nothing is
    changed where this is not PostgreSQL on psycopg 3.
    """
    connection = connections[db]
    raw = connection.connection
    if (
        connection.vendor != "postgresql"
        or not _is_psycopg3()
        or raw is None
        or raw.autocommit
        # psycopg's private parts this leans on; a release without them
        # gets psycopg's own BEGIN, as everywhere else.
        or not all(hasattr(raw, a) for a in ("_autocommit", "_get_tx_start_command", "_pipeline"))
    ):
        yield
        return
    with connection.execute_wrapper(_BeginFirst(raw)):
        yield


class _BeginFirst:
    """The execute wrapper of ``begin_with_first_statement``: armed for one statement."""

    __slots__ = ("armed", "raw")

    def __init__(self, raw: Any) -> None:
        self.raw, self.armed = raw, True

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if not self.armed:
            return execute(sql, params, many, context)
        self.armed = False
        from psycopg import pq

        raw, cursor = self.raw, context["cursor"].cursor
        if (
            not may_carry(raw, cursor, execute, many, sql)
            or raw.pgconn.transaction_status != pq.TransactionStatus.IDLE
        ):
            return execute(sql, params, many, context)  # psycopg sends its BEGIN
        begin = raw._get_tx_start_command().decode() + ";\n"
        # psycopg sends its own BEGIN only while it is not in autocommit:
        # for this one statement it is told it is, and the statement carries it.
        raw._autocommit = True
        try:
            result = execute(begin + sql, params, many, context)
        except Exception as error:
            _fail_block_if_begin_never_ran(raw, error, context["connection"])
            raise
        finally:
            raw._autocommit = False
        cursor.nextset()  # past BEGIN's result, to the statement's
        return result


def may_carry(raw: Any, cursor: Any, execute: Callable[..., Any], many: bool, sql: Any) -> bool:
    """Whether a statement an execute wrapper was handed may carry one of ours in
    front of it (``<ours>;\n<statement>``): a plain ``execute`` on a client-side
    binding cursor (Django's default), sent by the simple protocol that takes
    several statements, with nothing between the wrapper and the cursor
    (``callproc``, or another wrapper, might send statements of their own first)."""
    from psycopg import ClientCursor

    return (
        not many
        and isinstance(sql, str)  # not psycopg's ``sql.Composed``, nor bytes
        and getattr(execute, "__name__", None) == "_execute"
        and type(cursor).execute is ClientCursor.execute
        and isinstance(cursor, ClientCursor)
        and raw._pipeline is None
    )


def _fail_block_if_begin_never_ran(raw: Any, error: Exception, connection: Any) -> None:
    """Leave the block failed when the server refused ``BEGIN; <statement>`` whole.

    The server parses a query's every statement before it runs any: a
    statement it cannot parse fails without its ``BEGIN``, so no transaction
    is open to fail with it. The block's next statement would then open a
    fresh one, and a body that caught the error would commit what followed,
    where psycopg's own ``BEGIN`` would have left the transaction failed (every
    later statement refused, the block rolled back). Marking the block for
    rollback gives that outcome. An error raised before anything was sent
    (no SQLSTATE: the client's) leaves nothing to mark: psycopg's own
    ``BEGIN`` would have opened a transaction with nothing in it either.
    """
    from psycopg import pq

    cause = error.__cause__ or error
    if (
        getattr(cause, "sqlstate", None)
        and raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
    ):
        connection.needs_rollback = True


def _float(value: float | None) -> bytes:
    # Quoted: float8's input also reads repr's nan and inf.
    return b"NULL" if value is None else f"'{float(value)!r}'".encode()
