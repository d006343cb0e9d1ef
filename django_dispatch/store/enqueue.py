"""Inserting jobs: always in the caller's transaction, if there is one.

A job inserted inside ``transaction.atomic()`` exists exactly when the
surrounding data does: a rollback removes it and no worker can see it before
commit. On PostgreSQL an INSERT trigger sends NOTIFY (one per statement),
delivered at commit. ``enqueued_at`` and ``run_after`` come from the database
clock. A job deferred to later goes in as ``scheduled`` (out of the claim
index until the stager makes it pending, see ``staging``), any other as
pending. Partitioned jobs go in as pending too; the claim sorts out which one is
its partition's head (see ``partitions``).

Two ways in:

* ``jobs_insert`` / ``job_insert_idempotent`` take unsaved ``Job`` instances
  (the scheduler, workflows, idempotent enqueues): plain ORM.
* ``job_insert_call`` / ``jobs_insert_calls`` take a ``JobSpec`` (the columns
  every call of one task shares) and the calls' JSON: ``Task.enqueue()`` and
  ``enqueue_many()``. On PostgreSQL they run raw SQL, because there the ORM's
  per-row work was most of the cost (see their docstrings); elsewhere they
  build ``Job`` instances and use the ORM.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from ..core.states import FINISHED_STATES, LIVE_STATES, JobState
from ..models import Job
from .base import job_sql, now_plus, state_in
from .types import CallChunk, JobSpec

#: Rows per ``bulk_create`` batch (SQLite and other non-PostgreSQL engines).
BULK_BATCH_SIZE = 5000


def jobs_insert(jobs: Sequence[Job], *, db: str, batch_size: int = BULK_BATCH_SIZE) -> list[Job]:
    """Insert jobs (unsaved ``Job`` instances) through the ORM: pending, or
    scheduled when their ``run_after`` is later than now (``inserted_state``).

    ``enqueued_at`` and ``run_after`` come back through RETURNING.
    """
    now = timezone.now()
    for job in jobs:
        job.state = inserted_state(job, now)
    if len(jobs) == 1:
        jobs[0].save(using=db, force_insert=True)
        return list(jobs)
    return Job.objects.using(db).bulk_create(jobs, batch_size=batch_size)


def inserted_state(job: Job, now: datetime) -> JobState:
    """A new job's state: scheduled when its ``run_after`` is after ``now``, else
    pending.

    A ``run_after`` given as a value is compared with this process's clock
    (the raw INSERTs compare on the database's); a client clock behind the
    database's makes a job due already scheduled, which the stager makes
    pending at its next pass, and one ahead makes a job not quite due pending,
    which the claim's ``run_after <= now()`` holds back until due. A
    ``run_after`` left to the database (the insert's time) is pending; one
    given as an SQL expression keeps the state its caller chose.
    """
    when = job.run_after
    if isinstance(when, datetime):
        try:
            return JobState.SCHEDULED if when > now else JobState.PENDING
        except TypeError:  # naive against aware (USE_TZ changed under a value)
            return JobState.PENDING
    return JobState.SCHEDULED if job.state == JobState.SCHEDULED else JobState.PENDING


def job_insert_idempotent(
    job: Job, *, db: str, unique_for: float | None = None
) -> tuple[Job, bool]:
    """Insert ``job`` unless a live job holds its (namespace, task, idempotency key).

    Returns (the job, created). The partial unique index decides: two
    concurrent inserts of one key create one job, the other waits for the
    first to commit and gets it back. The attempt runs in a savepoint, so a
    conflict never aborts the caller's transaction.

    With ``unique_for`` (seconds), a job of the key that *finished* within
    that window also counts (``recently_finished``): it is returned instead.
    Checked before the insert and again after it, in the savepoint: an
    insert can succeed only because the holder's finish committed while it
    waited on the unique index, and the check after it then sees that job
    and undoes the insert.
    """
    for _ in range(3):
        try:
            with transaction.atomic(using=db):
                if unique_for is not None:
                    recent = recently_finished(job, unique_for, db=db)
                    if recent is not None:
                        return recent, False
                jobs_insert([job], db=db)
                if unique_for is not None:
                    recent = recently_finished(job, unique_for, db=db)
                    if recent is not None:
                        raise _FinishedMeanwhile(recent)
            return job, True
        except _FinishedMeanwhile as meanwhile:
            job.pk = None
            return meanwhile.job, False
        except IntegrityError:
            existing = (
                Job.objects.using(db)
                .filter(  # through dispatch_job_live_idempotency_key
                    state_in(LIVE_STATES),
                    namespace=job.namespace,
                    task_path=job.task_path,
                    idempotency_key=job.idempotency_key,
                )
                .first()
            )
            if existing is not None:
                return existing, False
            job.pk = None  # the holder finished meanwhile: the key is free again
    raise IntegrityError(
        f"could not enqueue {job.task_path} with idempotency key {job.idempotency_key!r}: "
        "it kept conflicting with jobs that finished at once; try again"
    )


class _FinishedMeanwhile(Exception):
    """Rolls back an insert's savepoint: a job of the key finished within the window."""

    def __init__(self, job: Job) -> None:
        self.job = job


def recently_finished(job: Job, seconds: float, *, db: str) -> Job | None:
    """The newest job of ``job``'s (namespace, task, idempotency key) that finished
    within ``seconds`` (database clock), other than ``job`` itself; None if none.

    Served by the partial index ``dispatch_job_key_finished`` (``state_in``: its
    condition, which SQLite needs repeated to read it).
    """
    finished = Job.objects.using(db).filter(
        state_in(FINISHED_STATES),
        namespace=job.namespace,
        task_path=job.task_path,
        idempotency_key=job.idempotency_key,
        finished_at__gte=now_plus(-seconds),
    )
    if job.pk is not None:
        finished = finished.exclude(pk=job.pk)
    return finished.order_by("-finished_at").first()


# --- enqueue from JSON: raw SQL on PostgreSQL -----------------------------------

#: The columns a fresh pending job sets, besides those with a database default
#: (``id``, ``enqueued_at``, ``run_after``) and the nullable lease/result ones,
#: which start NULL. ``tests/store/test_enqueue.py`` checks that a row inserted
#: here equals one inserted by the ORM, column by column.
_COLUMNS = (
    "namespace, task_path, backend, queue_name, priority, args, kwargs, state, deferred_until, "
    "partition_key, idempotency_key, attempts, max_attempts, worker_lost_count, lease_epoch, "
    "errors, worker_ids"
)
#: Placeholders ``job_sql`` fills in from the models when a statement runs:
#: the quoted ``Job._meta.db_table`` and ``JobState.PENDING`` as a literal.
_CONSTANTS = "{pending}"
#: A deferred job's state, on the database clock: scheduled when its
#: ``run_after`` (the parameter) is later than now, else pending.
_DEFERRED_STATE = "CASE WHEN %s::timestamptz > now() THEN {scheduled} ELSE {pending} END"
_TABLE = "{job}"


def _insert_one_sql(deferred: bool, traced: bool = False, contextual: bool = False) -> str:
    run_after = (", run_after", ", %s") if deferred else ("", "")
    trace = (", trace_context", ", %s::jsonb") if traced else ("", "")
    context = (", call_context", ", %s::jsonb") if contextual else ("", "")
    state = _DEFERRED_STATE if deferred else _CONSTANTS
    return (
        f"INSERT INTO {_TABLE} ({_COLUMNS}{run_after[0]}{trace[0]}{context[0]}) "
        f"VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, {state}, %s, %s, %s, "
        f"0, %s, 0, 0, '[]', '[]'{run_after[1]}{trace[1]}{context[1]}) "
        "RETURNING id, enqueued_at"
    )


def _insert_many_sql(deferred: bool, contextual: bool = False) -> str:
    run_after = (", run_after", ", %s") if deferred else ("", "")
    # The batch's one call context: a parameter after run_after's (if any),
    # before the calls' JSON.
    context = (", call_context", ", %s::jsonb") if contextual else ("", "")
    # One row per element of the JSON array of [args, kwargs] pairs, inserted
    # in input order (ORDER BY ordinality), so the identity column hands out
    # ascending ids in input order: sorting the ids back gives input order.
    # All rows of one statement share statement_timestamp(), the default of
    # enqueued_at and run_after: min() is every row's value.
    state = _DEFERRED_STATE if deferred else _CONSTANTS
    return (
        "WITH inserted AS ("
        f"INSERT INTO {_TABLE} ({_COLUMNS}{run_after[0]}{context[0]}) "
        f"SELECT %s, %s, %s, %s, %s, c -> 0, c -> 1, {state}, %s, %s, %s, "
        f"0, %s, 0, 0, '[]', '[]'{run_after[1]}{context[1]} "
        "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS calls (c, n) "
        "ORDER BY n "
        "RETURNING id, enqueued_at"
        ") SELECT array_agg(id ORDER BY id), min(enqueued_at), count(*) FROM inserted"
    )


#: By (deferred, traced, contextual): a traced enqueue stores its OpenTelemetry
#: context too, one with a call context that context; a plain enqueue neither
#: (the column is left out of its statement, not set to NULL).
_INSERT_ONE = {
    (deferred, traced, contextual): _insert_one_sql(deferred, traced, contextual)
    for deferred in (False, True)
    for traced in (False, True)
    for contextual in (False, True)
}
#: By (deferred, contextual).
_INSERT_MANY = {
    (deferred, contextual): _insert_many_sql(deferred, contextual)
    for deferred in (False, True)
    for contextual in (False, True)
}

#: A call context on its way into a row: (its JSON text, its value).
CallContext = tuple[str, Any]


def _spec_params(spec: JobSpec) -> list[Any]:
    """The parameters before ``args, kwargs`` in both statements."""
    return [spec.namespace, spec.task_path, spec.backend, spec.queue_name, spec.priority]


def _spec_tail(spec: JobSpec, connection: Any) -> list[Any]:
    """The parameters after them: when deferred, first the state's (its
    ``run_after``, see ``_DEFERRED_STATE``), and last ``run_after``.

    The datetime is adapted as the ORM would (``get_db_prep_save``).
    """
    if spec.deferred_until is None:
        return [None, spec.partition_key, spec.idempotency_key, spec.max_attempts]
    when = Job._meta.get_field("deferred_until").get_db_prep_save(spec.deferred_until, connection)
    return [when, when, spec.partition_key, spec.idempotency_key, spec.max_attempts, when]


def job_insert_call(
    spec: JobSpec,
    args: Any,
    kwargs: Any,
    args_json: str,
    kwargs_json: str,
    *,
    db: str,
    trace_context: str | None = None,
    call_context: CallContext | None = None,
) -> tuple[int, datetime]:
    """Insert one job of ``spec`` (scheduled when deferred to later, else pending);
    return its (id, enqueued_at).

    ``args``/``kwargs`` are the JSON values, ``args_json``/``kwargs_json``
    their text; ``trace_context`` the JSON text of the enqueue's
    OpenTelemetry context, if any (``Job.trace_context``); ``call_context``
    the enqueue's call context, if any (``Job.call_context``). On PostgreSQL
    this is one INSERT whose SQL is built once at import, the JSON text
    cast to jsonb. Why not ``save()``: measured on a
    local PostgreSQL, the ORM's per-insert work (preparing 24 fields,
    assembling the SQL) took about as long as the database took to run the
    INSERT and commit (~200 of ~475 µs for a bare ``Model.objects.create()``),
    and ``Task.enqueue()`` must stay within 1.2 times that ``create()`` although
    the job table has partial indexes and a NOTIFY trigger that a bare table
    has not. Elsewhere: the ORM.
    """
    connection = connections[db]
    if connection.vendor != "postgresql" or spec.resources or spec.locality:
        job = spec.new_job(args, kwargs, call_context)
        if trace_context is not None:
            job.trace_context = json.loads(trace_context)
        jobs_insert([job], db=db)
        return job.pk, job.enqueued_at
    deferred = spec.deferred_until is not None
    params = [*_spec_params(spec), args_json, kwargs_json, *_spec_tail(spec, connection)]
    traced = trace_context is not None
    if traced:
        params.append(trace_context)
    if call_context is not None:
        params.append(call_context[0])
    sql = _INSERT_ONE[deferred, traced, call_context is not None]
    with connection.cursor() as cursor:
        cursor.execute(job_sql(connection, sql), params)
        job_id, enqueued_at = cursor.fetchone()
    return job_id, enqueued_at


def jobs_insert_calls(
    spec: JobSpec,
    chunks: Sequence[CallChunk],
    *,
    db: str,
    call_context: CallContext | None = None,
) -> tuple[list[int], list[datetime]]:
    """Insert one job of ``spec`` per call (pending, or scheduled when deferred to
    later); return (ids, enqueued_ats) in call order.

    ``call_context``: the batch's one call context, stored on every job.

    All or nothing: the chunks go in under one ``atomic()`` (no savepoint
    when the caller already has a transaction).

    On PostgreSQL each chunk is one ``INSERT … SELECT FROM
    jsonb_array_elements(%s)``: the chunk's JSON text is the only per-call
    parameter, so Python neither builds a model instance nor prepares 24
    fields per row (which is what made ``bulk_create`` slow: about 7,000 rows
    per second), and the ids come back as one array (COPY cannot
    return them). Elsewhere: ``bulk_create``.
    """
    connection = connections[db]
    ids: list[int] = []
    enqueued: list[datetime] = []
    if connection.vendor != "postgresql" or spec.resources or spec.locality:
        jobs = [
            spec.new_job(args, kwargs, call_context)
            for chunk in chunks
            for args, kwargs in chunk.values
        ]
        with transaction.atomic(using=db, savepoint=False):
            jobs_insert(jobs, db=db)
        return [job.pk for job in jobs], [job.enqueued_at for job in jobs]
    deferred = spec.deferred_until is not None
    head = _spec_params(spec)
    tail = _spec_tail(spec, connection)
    if call_context is not None:
        tail.append(call_context[0])
    sql = job_sql(connection, _INSERT_MANY[deferred, call_context is not None])
    with transaction.atomic(using=db, savepoint=False), connection.cursor() as cursor:
        for chunk in chunks:
            cursor.execute(sql, [*head, *tail, chunk.text])
            chunk_ids, enqueued_at, count = cursor.fetchone()
            if count != len(chunk.values):  # cannot happen: the JSON is ours
                raise RuntimeError(f"inserted {count} jobs for {len(chunk.values)} calls")
            ids += chunk_ids
            enqueued += [enqueued_at] * count
    return ids, enqueued
