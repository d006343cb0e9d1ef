"""What a PostgreSQL server session is doing, read from outside it.

A test that proves what a connection sent (one round trip, a BEGIN riding a
statement) cannot ask that connection: asking is a statement of its own. It
reads ``pg_stat_activity`` from a fresh connection on another thread, which
Django gives its own connection, closed afterwards.
"""

from __future__ import annotations

import threading

from django.db import connections


def last_query(pid: int) -> str:
    """The last query server session ``pid`` received."""
    found: list[str] = []

    def read() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
                found.append(cursor.fetchone()[0])
        finally:
            connections["default"].close()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "pg_stat_activity did not answer within 60 s"
    return found[0]
