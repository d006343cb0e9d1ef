"""What running behind PgBouncer in transaction mode relies on, checked through a real one.

Run by ``make test-pgbouncer`` (DISPATCH_TEST_DB=pgbouncer, under
scripts/with-postgres, which starts PgBouncer 1.18 in transaction mode in
front of the throwaway PostgreSQL). In transaction mode each transaction may
run on a different server session, so whatever a client leaves in its
session (prepared statements, ``SET``, ``LISTEN``, session advisory locks)
can be missing on its next transaction, or be found by another client.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

import psycopg
import pytest
from django.db import connection

from tests.conftest import TEST_DB

pytestmark = [
    pytest.mark.skipif(TEST_DB != "pgbouncer", reason="runs through PgBouncer only"),
    pytest.mark.django_db,
]


def _client(**params) -> psycopg.Connection:
    """A client of PgBouncer connected with Django's own connection parameters."""
    django_params = dict(connection.get_connection_params())
    django_params.pop("cursor_factory", None)
    django_params.pop("context", None)
    return psycopg.connect(**{**django_params, **params}, autocommit=True)


def _interleave(a: psycopg.Connection, b: psycopg.Connection, rounds: int = 10) -> None:
    """Make two clients trade server sessions, each repeating its own statement."""
    for _ in range(rounds):
        with a.transaction():  # holds a server session, so b gets another one
            a.execute("SELECT %s::int", [1])
            b.execute("SELECT %s::text", ["b"])
        b.execute("SELECT %s::text", ["b"])  # most likely on the session a just left
        a.execute("SELECT %s::int", [2])


def test_the_suite_really_goes_through_pgbouncer_in_transaction_mode():
    bouncer = urlparse(os.environ["PGBOUNCER_URL"])
    assert connection.settings_dict["PORT"] == str(bouncer.port)
    connection.ensure_connection()
    admin = bouncer._replace(path="/pgbouncer").geturl()
    with psycopg.connect(admin, autocommit=True) as console:
        cursor = console.execute("SHOW POOLS")
        columns = [c.name for c in cursor.description or ()]
        pools = {row[columns.index("database")]: row for row in cursor.fetchall()}
    test_db = connection.settings_dict["NAME"]
    assert test_db in pools, f"no PgBouncer pool serves {test_db}: {sorted(pools)}"
    assert pools[test_db][columns.index("pool_mode")] == "transaction"


def test_djangos_connections_prepare_no_statements():
    """Django leaves ``prepare_threshold`` at None; PgBouncer 1.18 needs that.

    With psycopg's own default (prepare after 5 runs), a statement prepared
    on one server session is missing, or clashes with another client's, on
    the next: the control run below shows the interleaving catches it.
    """
    connection.ensure_connection()
    assert connection.connection.prepare_threshold is None
    with _client() as a, _client() as b:
        _interleave(a, b)

    with (
        _client(prepare_threshold=5) as a,
        _client(prepare_threshold=5) as b,
        pytest.raises(psycopg.errors.DuplicatePreparedStatement),
    ):
        _interleave(a, b)


def test_djangos_time_zone_follows_the_client_across_server_sessions():
    """Django may ``SET TIME ZONE`` once per connection; PgBouncer tracks that one.

    TimeZone is one of the parameters PgBouncer replays on whichever server
    session a client gets, so it holds although another client set another
    zone on the same server session. (An arbitrary ``SET`` would not.)
    """
    with _client() as a, _client() as b:
        a.execute("SET TIME ZONE 'UTC'")
        b.execute("SET TIME ZONE 'Asia/Tokyo'")
        seen_a, seen_b, pids = set(), set(), set()
        for _ in range(5):
            with b.transaction():
                b.execute("SELECT 1")
                row = a.execute("SELECT current_setting('TimeZone'), pg_backend_pid()")
                zone, pid = row.fetchone() or ("", 0)
                seen_a.add(zone)
                pids.add(pid)
            zone, pid = a.execute(
                "SELECT current_setting('TimeZone'), pg_backend_pid()"
            ).fetchone() or ("", 0)
            seen_a.add(zone)
            pids.add(pid)
            seen_b.add((b.execute("SELECT current_setting('TimeZone')").fetchone() or ("",))[0])
    assert len(pids) > 1, "the client never changed server session: not transaction pooling"
    assert seen_a == {"UTC"} and seen_b == {"Asia/Tokyo"}
