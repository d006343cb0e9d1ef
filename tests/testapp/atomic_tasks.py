"""Atomic tasks for tests/runtime/test_atomic.py: their writes are counted ``SideEffect`` rows.

Inside an atomic body nothing is visible to others before the commit, so a
body tells the test where it is through files (``signal``), never rows.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from django.utils import timezone

from django_dispatch import task
from django_dispatch.exceptions import JobCancelled

from .models import SideEffect
from .tasks import noop, quick_backoff


def _row(key: str, note: str = "atomic") -> SideEffect:
    return SideEffect.objects.create(key=key, note=note, worker_pid=os.getpid())


def _wait_for(path: str, max_seconds: float = 30) -> None:
    deadline = time.monotonic() + max_seconds
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@task(atomic=True, takes_context=True, max_attempts=3, backoff=quick_backoff)
def write_then_fail(context, key: str, succeed_on: int = 0):
    """Writes a row, then raises unless this is attempt ``succeed_on``."""
    _row(key, note=f"attempt-{context.task_result.attempts}")
    if context.task_result.attempts != succeed_on:
        raise RuntimeError(f"attempt {context.task_result.attempts} fails")
    return key


@task(atomic=True)
def write_rows(key: str, rows: int = 2):
    for _ in range(rows):
        _row(key)
    return key


@task(atomic=True)
def write_and_wait(key: str, signal: str, release: str, write_first: bool = True):
    """Writes (or not yet), tells the test it is waiting (``signal``), waits for ``release``."""
    if write_first:
        _row(key, note="before")
    Path(signal).touch()
    _wait_for(release)
    _row(key, note="after")
    return key


@task(atomic=True)
def write_and_enqueue(key: str, fail: bool = False):
    """The transactional outbox: a row and a follow-up job, both or neither."""
    _row(key)
    noop.enqueue(key)
    if fail:
        raise RuntimeError("the outbox rolls back with the row")
    return key


@task(atomic=True, takes_context=True)
def progress_until_cancelled(context, key: str, signal: str, write_first: bool = True):
    """Writes, reports progress until the job is gone; the checkpoint it saw goes to a file."""
    Path(signal).with_suffix(".checkpoint").write_text(repr(context.checkpoint))
    if write_first:
        _row(key)
    step = 0
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            step += 1
            context.progress(step)
            Path(signal).touch()
            time.sleep(0.02)
    except JobCancelled:
        Path(signal).with_suffix(".cancelled").touch()
        raise
    return key


@task(atomic=True, takes_context=True, max_attempts=1)
def save_an_artifact(context, key: str):
    _row(key)
    context.save_artifact("report.txt", b"hello")
    return key


def _effect(context, key: str, seconds: float) -> dict[str, object]:
    """One ``note="effect"`` row per execution, with no unique key: what exactly-once counts."""
    row = SideEffect.objects.create(
        key=key, job_id=context.task_result.id, worker_pid=os.getpid(), note="effect"
    )
    time.sleep(seconds)
    # A last write, so that a fault during the work reaches the task's own code.
    SideEffect.objects.filter(pk=row.pk).update(finished_at=timezone.now())
    return {"key": key}


@task(atomic=True, takes_context=True)
def effect_atomic(context, key: str, seconds: float = 0.05):
    """The chaos suite's atomic load: its effect commits with its success, once."""
    return _effect(context, key, seconds)


@task(takes_context=True)
def effect_plain(context, key: str, seconds: float = 0.05):
    """``effect_atomic`` without ``atomic=True``: at least once, so faults duplicate it."""
    return _effect(context, key, seconds)


@task(atomic=True, takes_context=True, timeout=0.3, max_attempts=1)
def write_past_timeout(context, key: str, write_first: bool = True):
    """Works past its timeout until asked to stop, writes, and returns as if done.

    ``write_first``: the row before the work. Not on SQLite, where that write
    would hold the write lock the worker's control loop needs to get to its
    timeout check.
    """
    if write_first:
        _row(key, note="before")
    deadline = time.monotonic() + 10
    while not context.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    _row(key, note="after")
    return key


@task(atomic=True, max_attempts=1)
def write_then_mark_for_rollback(key: str):
    """Writes a row, asks Django to roll the transaction back, and returns normally."""
    from django.db import transaction

    _row(key)
    transaction.set_rollback(True)
    return key


#: The keys whose ``on_commit`` callback ran (``write_with_hook``), in this process.
COMMITTED: list[str] = []


@task(atomic=True, max_attempts=2, backoff=quick_backoff)
def write_with_hook(key: str, fail: bool = False):
    """A row and an ``on_commit`` callback; raises after both when ``fail``."""
    from django.db import transaction

    _row(key)
    transaction.on_commit(lambda: COMMITTED.append(key))
    if fail:
        raise RuntimeError(f"{key} fails after its write")
    return key


@task(atomic=True)
def atomic_noop(key: str):
    """Writes nothing: its success is the transaction's only write."""
    return key


@task(atomic=True, timeout=0.3, max_attempts=1)
def hang_ignoring_stop(key: str, seconds: float, done: str):
    """Writes, then works ``seconds`` deaf to its stop (its thread is given up on),
    then says so through ``done``."""
    _row(key)
    time.sleep(seconds)
    Path(done).touch()
    return key


#: A table whose foreign key PostgreSQL checks only at COMMIT (as Django's own
#: foreign keys are, ``DEFERRABLE INITIALLY DEFERRED``); made by the test.
ORPHANS_SQL = """
CREATE TABLE IF NOT EXISTS dispatch_test_parent (id integer PRIMARY KEY);
CREATE TABLE IF NOT EXISTS dispatch_test_orphan (
    id serial PRIMARY KEY,
    parent_id integer REFERENCES dispatch_test_parent DEFERRABLE INITIALLY DEFERRED
)
"""


@task(atomic=True, max_attempts=1)
def write_orphan(key: str):
    """A row whose foreign key points at nothing: refused only at its COMMIT."""
    from django.db import connection

    _row(key)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO dispatch_test_orphan (parent_id) VALUES (-1)")
    return key


@task(atomic=True, max_attempts=1)
def write_then_return_too_deep(key: str):
    """Writes, then returns a value too deeply nested to encode."""
    _row(key)
    value: list = []
    for _ in range(100_000):
        value = [value]
    return value


@task(atomic=True)
def touch_row(pk: int):
    """Updates ``SideEffect`` row ``pk``: its lock is held until the transaction ends."""
    SideEffect.objects.filter(pk=pk).update(note="touched")


@task(atomic=True, max_attempts=2, backoff=quick_backoff)
def write_by(key: str, how: str, fail: bool = False):
    """Writes a row by ``how`` (each a different path to the server), then raises if ``fail``.

    ``orm``: Django's ORM; ``raw``: a psycopg cursor of the connection, past
    Django's; ``copy``: ``COPY ... FROM STDIN``; ``many``: ``executemany()``;
    ``composed``: a Django cursor given psycopg's ``sql.Composed``;
    ``psycopg-transaction``: a raw cursor inside psycopg's own
    ``transaction()``, which takes and releases a savepoint of its own;
    ``nested``: the ORM inside a nested ``transaction.atomic()``;
    ``client-error``: a statement psycopg refuses before sending it (caught),
    then the ORM; ``syntax-error``: a first statement the server cannot parse
    (caught); ``close``: the ORM, then ``connection.close()``; ``rollback`` and
    ``commit``: the ORM, psycopg's ``rollback()`` or ``commit()`` on the raw
    connection, the ORM again; ``sql-rollback``: the same with a ``ROLLBACK``
    statement; ``none``: nothing.
    """
    from django.db import connection, transaction

    table = SideEffect._meta.db_table
    insert = f"INSERT INTO {table} (key, job_id, worker_pid, note) VALUES (%s, '', 0, %s)"
    if how == "orm":
        _row(key, note=how)
    elif how in ("raw", "psycopg-transaction"):
        connection.ensure_connection()
        raw = connection.connection
        if how == "raw":
            raw.cursor().execute(insert, (key, how))
        else:
            with raw.transaction():
                raw.cursor().execute(insert, (key, how))
    elif how == "composed":
        from psycopg import sql

        composed = sql.SQL(insert.replace(table, "{}")).format(sql.Identifier(table))
        with connection.cursor() as cursor:
            cursor.execute(composed, [key, how])
    elif how == "many":
        with connection.cursor() as cursor:
            cursor.executemany(insert, [(key, how)])
    elif how == "nested":
        with transaction.atomic():
            _row(key, note=how)
    elif how == "client-error":
        with contextlib.suppress(Exception), connection.cursor() as cursor:
            cursor.execute("SELECT %s, %s", [1])  # one parameter short: never sent
        _row(key, note=how)
    elif how == "syntax-error":
        with contextlib.suppress(Exception), connection.cursor() as cursor:
            cursor.execute("SELEC 1")
    elif how == "close":
        _row(key, note=how)
        connection.close()
    elif how in ("rollback", "commit", "sql-rollback"):
        _row(key, note=how)
        if how == "sql-rollback":
            with connection.cursor() as cursor:
                cursor.execute("ROLLBACK")
        else:
            getattr(connection.connection, how)()
        _row(key, note=how)  # in a transaction psycopg begins afresh
    elif how == "copy":
        with connection.cursor() as cursor:
            copy_sql = f"COPY {table} (key, job_id, worker_pid, note) FROM STDIN"
            with cursor.copy(copy_sql) as copy:
                copy.write_row((key, "", 0, how))
    if fail:
        raise RuntimeError(f"{key} fails after writing by {how}")
    return key
