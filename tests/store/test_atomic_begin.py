"""An atomic block's BEGIN sent with its first statement (PostgreSQL, psycopg 3).

``begin_with_first_statement`` saves the round trip of psycopg's own BEGIN
by sending it in the same query as the body's first statement. What must
hold: that statement's result is the one the caller sees (a RETURNING id, an
UPDATE's row count); everything the block sends, whatever the path (a Django
cursor, a raw psycopg cursor, ``executemany``), runs inside the one
transaction and rolls back with it; a first statement that fails leaves
the block to roll back as usual, and the connection usable after it.
Each case is checked from the database afterwards.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

from django_dispatch.store.atomic_finish import begin_with_first_statement
from tests.conftest import TEST_DB, postgres_only
from tests.server_activity import last_query
from tests.testapp.models import SideEffect

# In the PgBouncer tier too: the BEGIN that rides a statement must hold through a pooler.
pytestmark = [pytest.mark.django_db(transaction=True), postgres_only, pytest.mark.pgbouncer]

INSERT = "INSERT INTO testapp_sideeffect (key, job_id, worker_pid, note) VALUES "


class _Abort(Exception):
    pass


def test_the_first_statement_carries_the_begin_and_its_own_result():
    with transaction.atomic(), begin_with_first_statement("default"):
        row = SideEffect.objects.create(key="k", note="first")
        if TEST_DB != "pgbouncer":  # a pooled client has no backend of its own
            last = last_query(connection.connection.info.backend_pid)
            assert last.startswith("BEGIN;\n") and "INSERT" in last, last
        # The INSERT's RETURNING, not BEGIN's empty result, gave the id.
        assert SideEffect.objects.filter(pk=row.pk, note="first").exists()
        assert SideEffect.objects.filter(pk=row.pk).update(note="second") == 1
    assert list(SideEffect.objects.values_list("note", flat=True)) == ["second"]
    assert connection.get_autocommit()


def test_an_update_first_reports_its_row_count():
    SideEffect.objects.create(key="a", note="x")
    SideEffect.objects.create(key="b", note="x")
    with transaction.atomic(), begin_with_first_statement("default"):
        assert SideEffect.objects.filter(note="x").update(note="y") == 2
    assert set(SideEffect.objects.values_list("note", flat=True)) == {"y"}


@pytest.mark.parametrize("first", ["orm", "raw-psycopg", "executemany"])
def test_every_write_of_the_block_rolls_back_with_it(first):
    with pytest.raises(_Abort), transaction.atomic(), begin_with_first_statement("default"):
        if first == "raw-psycopg":  # past Django's cursor: psycopg sends its own BEGIN
            with connection.connection.cursor() as cursor:
                cursor.execute(INSERT + "('k', '', 0, 'raw')")
        elif first == "executemany":
            with connection.cursor() as cursor:
                cursor.executemany(
                    INSERT + "(%s, '', 0, 'many')",
                    [("k",), ("k2",)],
                )
        else:
            SideEffect.objects.create(key="k", note="orm")
        SideEffect.objects.create(key="k3", note="later")
        raise _Abort
    assert not SideEffect.objects.exists()
    assert connection.get_autocommit()


def test_a_first_statement_that_fails_rolls_the_block_back_and_the_connection_goes_on():
    with (
        pytest.raises(IntegrityError),
        transaction.atomic(),
        begin_with_first_statement("default"),
        connection.cursor() as cursor,
    ):
        cursor.execute(INSERT + "(NULL, '', 0, '')")
    assert not SideEffect.objects.exists()
    with transaction.atomic(), begin_with_first_statement("default"):
        SideEffect.objects.create(key="k", note="after")
    assert list(SideEffect.objects.values_list("note", flat=True)) == ["after"]


def test_a_first_statement_the_server_cannot_parse_leaves_the_block_failed():
    """The server parses ``BEGIN; <statement>`` whole before running any of it:
    a statement it cannot parse fails without its BEGIN. A body that catches
    the error must still not commit what it writes next."""
    with transaction.atomic(), begin_with_first_statement("default"):
        with pytest.raises(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELEC 1")
        with pytest.raises(DatabaseError):  # refused, as after psycopg's own BEGIN
            SideEffect.objects.create(key="k", note="after a caught error")
    assert not SideEffect.objects.exists()
    with transaction.atomic(), begin_with_first_statement("default"):
        SideEffect.objects.create(key="k", note="next block")
    assert list(SideEffect.objects.values_list("note", flat=True)) == ["next block"]


def test_inside_an_open_transaction_it_sends_nothing_of_its_own():
    with transaction.atomic():
        SideEffect.objects.create(key="outer", note="o")
        with pytest.raises(_Abort), transaction.atomic(), begin_with_first_statement("default"):
            SideEffect.objects.create(key="inner", note="i")  # a savepoint's, no BEGIN
            raise _Abort
    assert list(SideEffect.objects.values_list("key", flat=True)) == ["outer"]
