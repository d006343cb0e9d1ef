"""The wave's functions keep a generic plan for a server session, made at its
first call from the job table as it is then (migrations 0027, 0030, 0032).

A plan made while the table was small must still read only the wave's rows
once the table is large: a session planned before a backlog arrived (a fresh
database, a ``ctx.map`` set inserted after the workers started) otherwise
read every job row at every wave, for as long as the session lived. What a
call read is counted by the server (``pg_stat_xact_user_tables``: the rows
its scans of the job table returned, in the calling transaction), not timed.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from django_dispatch.models import Job
from django_dispatch.states import JobState
from tests.conftest import postgres_only
from tests.store.helpers import claim
from tests.testapp.tasks import noop

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

#: Rows the table holds when the session's plans are made, and after.
LARGE = 20_000
#: The job table's rows one call read: by its scans' index fetches and heap reads.
ROWS_READ = """
SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)
FROM pg_stat_xact_user_tables WHERE relname = 'django_dispatch_job'
"""


def _ids(first: int, count: int) -> str:
    return "{" + ",".join(str(i) for i in range(first, first + count)) + "}"


def _finish(first: int, count: int, keyed: bool = False) -> tuple[str, tuple]:
    ids = _ids(first, count)
    rest = ("{" + ",".join(["w"] * count) + "}", "{" + ",".join(["1"] * count) + "}")
    values = "{" + ",".join(['"null"'] * count) + "}"
    if keyed:
        keys = "{" + ",".join(f"k{i}" for i in range(first, first + count)) + "}"
        return (
            "SELECT won FROM django_dispatch_finish_keyed_wave(%s::bigint[], %s::text[],"
            " %s::bigint[], %s::jsonb[], NULL, NULL, NULL, NULL, NULL, NULL, %s::text[], '',"
            " 'wave_plan_test')",
            (ids, *rest, values, keys),
        )
    return (
        "SELECT won FROM django_dispatch_finish_wave(%s::bigint[], %s::text[], %s::bigint[],"
        " %s::jsonb[], NULL, NULL, NULL, NULL, NULL, NULL)",
        (ids, *rest, values),
    )


def _lease(first: int, count: int) -> tuple[str, tuple]:
    return (
        "SELECT django_dispatch_lease_wave(%s::bigint[], 'w2', 30, now())",
        (_ids(first, count),),
    )


def _runnable(first: int, count: int) -> tuple[str, tuple]:
    keys = "{" + ",".join(["NULL"] * count) + "}"
    return (
        "SELECT leased FROM django_dispatch_lease_runnable(%s::bigint[], %s::text[], 'w2', 30,"
        " now(), '')",
        (_ids(first, count), keys),
    )


@pytest.fixture
def session() -> Iterator[psycopg.Connection]:
    """A server session of its own: its first call of each function plans it afresh."""
    settings = connection.settings_dict
    params = {
        "dbname": settings["NAME"],
        "user": settings["USER"],
        "password": settings["PASSWORD"],
        "host": settings["HOST"],
        "port": settings["PORT"],
    }
    with psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True) as conn:
        yield conn


def _copy(session: psycopg.Connection, template: int, first: int, last: int, **values) -> None:
    """Rows ``first``..``last`` as copies of ``template``, ``values`` (SQL) in some columns."""
    columns = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
    select = ", ".join(values.get(c, "t." + c) for c in columns)
    session.execute(
        f"INSERT INTO django_dispatch_job (id, {', '.join(columns)}) SELECT g, {select}"
        " FROM django_dispatch_job AS t, generate_series(%s::bigint, %s::bigint) AS g"
        " WHERE t.id = %s",
        (first, last, template),
    )


def _rows_read(session: psycopg.Connection, call: tuple[str, tuple]) -> tuple[int, object]:
    """What ``call`` returned and how many job rows it read, rolled back."""
    with session.transaction(force_rollback=True):
        before = session.execute(ROWS_READ).fetchone()[0]
        result = session.execute(*call).fetchone()[0]
        return session.execute(ROWS_READ).fetchone()[0] - before, result


RUNNING = {"state": "'running'", "worker_id": "'w'", "lease_epoch": "1"}


def _template(session: psycopg.Connection) -> int:
    """A job row to copy, written by the ORM (the columns' defaults), and gone:
    the copies are all the table holds."""
    enqueued = int(noop.enqueue().id)
    _copy(session, enqueued, -1, -1)
    session.execute("DELETE FROM django_dispatch_job WHERE id = %s", (enqueued,))
    return -1


@pytest.mark.parametrize("small", [0, 20])
@pytest.mark.parametrize("analyzed", [False, True], ids=["never-analyzed", "analyzed"])
def test_a_wave_planned_on_a_small_job_table_reads_only_its_rows(session, small, analyzed):
    template = _template(session)
    # Ids the sequence never gives: the next template's enqueue must not meet them.
    _copy(session, template, -1000 - small, -1001, **RUNNING)
    session.execute("DELETE FROM django_dispatch_job WHERE id = %s", (template,))
    if analyzed:  # as autovacuum leaves a table that was small
        session.execute("ANALYZE django_dispatch_job")
    # The plans, made on the small table (ids no row holds).
    for call in (_finish(-10, 1), _finish(-10, 1, keyed=True), _lease(-10, 1), _runnable(-10, 1)):
        _rows_read(session, call)
    template = _template(session)
    base = 1_000_000
    _copy(session, template, base, base + LARGE, **RUNNING)
    _copy(session, template, 2 * base, 2 * base + LARGE, state="'pending'")
    _copy(session, template, 3 * base, 3 * base + 4, **RUNNING, partition_key="'k' || g")

    calls = {
        "finish": _finish(base + 100, 5),
        "finish_keyed": _finish(3 * base, 5, keyed=True),
        "lease_wave": _lease(2 * base + 100, 5),
        "lease_runnable": _runnable(2 * base + 200, 5),
    }
    reads = {}
    for name, call in calls.items():
        reads[name], result = _rows_read(session, call)
        assert result is not None and result != 0, (name, result)
    # Each of the 5 ids looked up once (the keyed finish also reads each freed
    # key's head), not the rows of a scan of the table.
    assert all(read <= 15 for read in reads.values()), reads


@pytest.mark.parametrize("stale_first", [True, False])
def test_an_id_twice_in_one_finish_is_written_under_its_current_lease(stale_first):
    """A wave that holds two attempts of one job (a stale one's entry beside the
    current one's) finishes it under the current lease, in either order; a NULL
    id is passed over."""
    job_id = int(noop.enqueue().id)
    [claimed] = claim(worker="w1")
    epoch = claimed.lease.epoch
    epochs = [epoch - 1, epoch] if stale_first else [epoch, epoch - 1]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT won FROM django_dispatch_finish_wave(%s::bigint[], %s::text[],"
            " %s::bigint[], %s::jsonb[], NULL, NULL, NULL, NULL, NULL, NULL)",
            ([job_id, None, job_id], ["w1"] * 3, [epochs[0], 0, epochs[1]], ["1"] * 3),
        )
        assert cursor.fetchone()[0] == [job_id]
    assert Job.objects.get(pk=job_id).state == JobState.SUCCEEDED
