"""A group of atomic jobs in one transaction: the savepoints between their bodies, and
their successes written with the COMMIT, in one round trip.

A job thread that runs atomic jobs back to back keeps one transaction open
across several of them (``runtime.atomic_group``). Alone, each atomic job is a
writing transaction of its own: a commit that waits for its WAL flush, and a
success UPDATE of its own, where a wave of plain successes shares one of each
among many jobs.

``member_savepoint``: around a member's body, a savepoint when the transaction
already holds what earlier members wrote, so that a body that fails is undone
alone (``member_undo``). None when no transaction is open yet: nothing is
there to keep, and rolling the whole transaction back undoes that member only.
The savepoint is sent with the body's first statement (``MemberSavepoint``),
not before the body in a round trip of its own: one wake-up of the job thread
and of the server fewer per member, and none at all for a body that sends
nothing.

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

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import InterfaceError, connections, transaction

from .atomic_finish import LOST, commit_if_fenced, may_carry
from .finish import MeasuredUsage, finish_params
from .types import Lease

logger = logging.getLogger("django_dispatch.store")

#: A member's savepoint: a name of its own (``%d``: its number in the group),
#: so that a rollback to it can never reach an earlier member's. Were it
#: released under the body (by a savepoint the body took around it some way
#: no hook of ``MemberSavepoint`` sees), the rollback fails instead, and the
#: whole group is rolled back.
_SAVEPOINT = b"SAVEPOINT django_dispatch_member_%d"
_ROLLBACK_TO = b"ROLLBACK TO SAVEPOINT django_dispatch_member_%d"
_RELEASE = b"RELEASE SAVEPOINT django_dispatch_member_%d;\n"

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


def member_savepoint(db: str, number: int) -> MemberSavepoint | None:
    """For a member's body, in the group's open ``atomic`` block: its savepoint,
    to use as a context manager around the body, or None when no transaction
    is open yet (nothing written there to keep). ``number``: unique in the
    group. Raises when the connection cannot carry the group on (closed or
    broken): the member's code has not started."""
    from psycopg import pq

    connection = connections[db]
    connection.ensure_connection()
    raw = connection.connection
    status = raw.pgconn.transaction_status
    if status == pq.TransactionStatus.IDLE:
        return None
    if status != pq.TransactionStatus.INTRANS or raw.pgconn.status != pq.ConnStatus.OK:
        raise InterfaceError(f"the connection to {db!r} no longer holds its group's transaction")
    savepoint = MemberSavepoint(connection, raw, number)
    if not all(hasattr(raw, a) for a in ("_start_query", "_exec_command", "_pipeline")):
        # psycopg's private parts the ride leans on: without them, sent now.
        _exec(connection, savepoint.sql)
        savepoint.taken, savepoint.rides = True, False
    return savepoint


class MemberSavepoint:
    """A member's savepoint, taken with the first statement its body sends.

    Three hooks, installed for the body only (and until it is taken), take it:

    - Django's execute wrapper puts it in front of the body's first statement
      when that can carry it (``atomic_finish.may_carry``: Django's ORM and
      ``connection.cursor()``, by default), as ``SAVEPOINT ...;\n<statement>``;
    - psycopg's start of every cursor's query (``_start_query``, which sends a
      transaction's ``BEGIN``) sends it alone before anything else: a raw
      psycopg cursor, ``COPY``, ``executemany``, a server-side cursor or
      binding, a pipeline, or a statement that could not carry it;
    - psycopg's own commands (``_exec_command``: its ``transaction()``'s
      savepoints, ``commit()``, ``rollback()``) send it alone first, so that
      a savepoint of psycopg's is taken inside it, never around it.

    ``taken`` says whether it was. A body that sent nothing needs no undo.
    ``ended``: the body ended the group's transaction itself (psycopg's
    ``commit()`` or ``rollback()`` on the raw connection, even if a later
    statement began another): nothing of the group can be kept apart any
    more, nor its successes committed (``member_undo``, ``ended``).
    """

    __slots__ = ("connection", "ended", "number", "raw", "rides", "sql", "taken")

    def __init__(self, connection: Any, raw: Any, number: int) -> None:
        self.connection, self.raw, self.number = connection, raw, number
        self.sql = _SAVEPOINT % number
        self.taken = self.ended = False
        self.rides = True

    def __enter__(self) -> MemberSavepoint:
        if self.rides:
            self.raw._start_query = self._start_query  # this connection only
            self.raw._exec_command = self._exec_command
            self.connection.execute_wrappers.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.rides:
            self._taken()
            self.raw.__dict__.pop("_exec_command", None)
            self.rides = False

    def _taken(self) -> None:
        """The statements' hooks out, once the savepoint is taken: the body's
        later statements pass neither. psycopg's commands still pass theirs,
        which sees a body end the transaction (rare, and no statement's cost)."""
        self.raw.__dict__.pop("_start_query", None)
        with contextlib.suppress(ValueError):
            self.connection.execute_wrappers.remove(self)

    def _take(self) -> Any:
        """psycopg's part: the savepoint alone, if not taken yet, in the group's
        transaction; one found ended (IDLE: the body ended it) is marked so."""
        from psycopg import pq

        raw = self.raw
        if self.taken:
            return
        status = raw.pgconn.transaction_status
        if status == pq.TransactionStatus.INTRANS:
            yield from type(raw)._exec_command(raw, self.sql)
            self.taken = True
            self._taken()
        elif status == pq.TransactionStatus.IDLE:
            self.ended = True

    def _start_query(self) -> Any:
        yield from self._take()
        yield from type(self.raw)._start_query(self.raw)

    def _exec_command(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        yield from self._take()
        if command in (b"COMMIT", b"ROLLBACK"):  # psycopg's commit() and rollback()
            self.ended = True
        return (yield from type(self.raw)._exec_command(self.raw, command, *args, **kwargs))

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        """Django's execute wrapper: the savepoint in front of the first statement.

        If the server refuses the query whole (a syntax error: it parses every
        statement of a query before it runs any), the savepoint was not taken
        though ``taken`` says it was: the rollback to it then fails, and the
        group rolls back whole, as it must, the transaction being failed. An
        error before anything reached the server (the client's: no SQLSTATE)
        leaves the savepoint untaken, for the next statement to take."""
        if self.taken:
            return execute(sql, params, many, context)
        from psycopg import pq

        cursor = context["cursor"].cursor
        if (
            not may_carry(self.raw, cursor, execute, many, sql)
            or self.raw.pgconn.transaction_status != pq.TransactionStatus.INTRANS
        ):
            return execute(sql, params, many, context)  # psycopg's hooks send it
        self.taken = True  # before: psycopg's hooks must not send it again
        try:
            result = execute(self.sql.decode() + ";\n" + sql, params, many, context)
        except Exception as error:
            cause = error.__cause__ or error
            if getattr(cause, "sqlstate", None) is None:
                self.taken = False  # nothing of it reached the server
            raise
        self._taken()
        cursor.nextset()  # past the savepoint's result, to the statement's
        return result


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


#: Why an atomic job in a group fails when its body ended the transaction.
ENDED = (
    "the atomic task ended its transaction itself (COMMIT or ROLLBACK through the raw "
    "psycopg connection, or connection.close()): its writes can no longer be told from "
    "those of the atomic jobs run with it, so this attempt fails and they go back to "
    "the queue. Leave the transaction to the worker: raise an exception to undo the "
    "task's writes."
)


def ended(db: str, savepoint: MemberSavepoint) -> bool:
    """After a member's body: whether its group's transaction is gone (the body
    ended it, or closed the connection). A COMMIT or ROLLBACK sent as SQL
    escapes this; the group's commit finds it (``commit_successes_if_leased``)."""
    from psycopg import pq

    raw = connections[db].connection
    if raw is None or savepoint.ended:
        return True
    return raw.pgconn.transaction_status not in (
        pq.TransactionStatus.INTRANS,
        pq.TransactionStatus.INERROR,
    )


def member_undo(db: str, savepoint: MemberSavepoint | None) -> None:
    """After a member's body that must keep nothing: back to its savepoint, or,
    without one, the whole transaction (which then held only that member's).

    A savepoint the body never took leaves nothing of the member's to undo,
    but a transaction failed, ended or lost meanwhile cannot go on: raised, so
    that the group rolls back."""
    from psycopg import pq

    connection = connections[db]
    raw = connection.connection
    if raw is None:  # closed by the body or by Django after a lost connection
        raise InterfaceError(f"the connection to {db!r} was closed")
    status = raw.pgconn.transaction_status
    if savepoint is None:
        if status != pq.TransactionStatus.IDLE:
            _exec(connection, b"ROLLBACK")
    elif savepoint.ended or not (savepoint.taken or status == pq.TransactionStatus.INTRANS):
        raise InterfaceError(
            "an atomic job's body ended or closed its group's transaction, or failed it "
            "before its savepoint was taken: the group's transaction cannot go on"
        )
    elif savepoint.taken:
        _exec(connection, _ROLLBACK_TO % savepoint.number)


def commit_successes_if_leased(
    results: Sequence[tuple[Lease, Any]],
    usage: MeasuredUsage | None,
    *,
    db: str,
    first_savepoint: int | None = None,
) -> bool:
    """In the group's open ``atomic`` block: every member's success (and usage
    record), fenced, and COMMIT. True: all committed. False: a fence failed,
    nothing is committed, and the block is left for the caller to roll back.

    ``first_savepoint``: the number of the first member savepoint taken in the
    transaction, released first in the same query. A body that ended the
    transaction with SQL of its own (``ROLLBACK``, ``COMMIT AND CHAIN``),
    where no hook sees it, took that savepoint with it: the release then
    fails, and nothing commits, rather than the earlier members' successes
    without their writes."""
    params = finish_params(results, usage)
    release = b"" if first_savepoint is None else _RELEASE % first_savepoint

    def render(text: Callable[[str | None], bytes]) -> bytes:
        values = [text(params[name]) for name in _ARRAYS]
        values += [text(params[name]) for name in _USAGE] if usage else [b"NULL"] * len(_USAGE)
        return release + _GROUP_SQL % (len(results), *values)

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


class _RollBack(Exception):
    """Leaves the group's block without committing (never seen outside this module)."""


def leave_block(
    block: transaction.Atomic, db: str, won: bool, error: BaseException | None
) -> list[Any]:
    """Leave the group's block, by Django's commit (the COMMIT went with the
    successes) or its rollback; the committed ``on_commit`` callbacks, taken
    out for the caller to run once the members are ended. Never raises."""
    connection = connections[db]
    callbacks: list[Any] = []
    if won:
        wrapper: Any = connection  # Django's (savepoints, callback, robust) triples
        callbacks = [func for _, func, _ in wrapper.run_on_commit]
        wrapper.run_on_commit = []
        try:
            block.__exit__(None, None, None)
        except Exception:
            logger.exception("leaving a committed group of atomic jobs failed")
        return callbacks
    exc = error or _RollBack()
    try:
        block.__exit__(type(exc), exc, exc.__traceback__)
    except Exception:  # its rollback failed and reconnecting did too: closed
        logger.warning("rolling back a group of atomic jobs failed", exc_info=True)
    return callbacks
