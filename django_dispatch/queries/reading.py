"""Where operators' reads go: the read replica when it is healthy, else the primary.

``DISPATCH["READ_DATABASE"]`` names a streaming replica of the jobs' database.
The console, the admin's change lists and the list functions read from it,
so that an operator paging through millions of finished jobs, or a dashboard
polling the overview, costs the primary nothing. Nothing else may: a claim,
a write, or a read that decides a write (an admin action's selection, a
service's guard, the store, the worker) reads what the primary holds *now*,
and a replica is by nature some milliseconds to minutes behind; those keep
calling ``store.base.db_alias()``, "the primary" here too.

A replica that is down, or further behind than ``READ_MAX_LAG`` seconds,
serves nothing: reads go to the primary, and ``health()`` says why, which the
console shows. The verdict is kept ``VERDICT_SECONDS`` (a page's dozen
queries, and the pages of the next seconds, share one probe), and a probe
of a dead or unreachable replica gives up after ``PROBE_TIMEOUT`` seconds,
so a replica that vanishes costs a page that much once, never a hang.

The lag is measured against the primary: the primary's flushed WAL position
(``pg_current_wal_flush_lsn()``) is read first, then the replica's replayed
one. Replayed up to there, the replica is caught up (lag 0), however long ago
its last transaction was; behind it, the lag is the age of the last
transaction it replayed (``pg_last_xact_replay_timestamp()``): everything
committed before that is there, so its data is at most that old.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.db import connections, router

from ..conf import generation, get_settings
from ..models import Job
from ..store.base import db_alias

__all__ = ["ReadHealth", "forget", "health", "read_alias", "replica_of"]

#: Seconds a verdict on a replica is kept before it is probed again.
VERDICT_SECONDS = 5.0
#: Seconds a probe waits to connect to the replica, and for its one query.
PROBE_TIMEOUT = 2.0


@dataclass(frozen=True)
class ReadHealth:
    """Where reads go for one primary, and why."""

    #: The jobs' database (``store.base.db_alias()``).
    primary: str
    #: Its configured replica, or None.
    replica: str | None
    #: The database reads use now: the replica when healthy, else the primary.
    used: str
    #: "none" (no replica configured), "ok", "down", "lagging" or "not a standby".
    state: str
    #: Seconds behind the primary (0.0 caught up); None when not measured.
    lag: float | None = None
    #: Bytes of WAL the replica has still to replay; None when not measured.
    behind_bytes: int | None = None
    #: What the probe found, in words (the error of a replica that is down).
    detail: str = ""

    @property
    def fallback(self) -> bool:
        """A replica is configured, and reads go to the primary instead."""
        return self.replica is not None and self.used != self.replica


_verdicts: dict[tuple[str, str, int], tuple[float, ReadHealth]] = {}
_lock = threading.Lock()


def replica_of(primary: str) -> str | None:
    """The replica ``READ_DATABASE`` names for the jobs' database ``primary``, or None.

    A string names the replica of the jobs' default database (the routers'
    choice for ``Job``); a dict names one per jobs' database. A database
    without one, or a replica named as itself, has none.
    """
    configured = get_settings().READ_DATABASE
    if isinstance(configured, dict):
        replica = configured.get(primary)
    else:
        replica = configured if primary == router.db_for_write(Job) else None
    return replica if replica and replica != primary else None


def read_alias() -> str:
    """The database operators' reads use now: the healthy replica, or the primary.

    The primary inside a transaction open on it (``ATOMIC_REQUESTS``, a view
    that enqueues then lists): the replica cannot see what that transaction
    wrote and has not committed, and a page must show its own writes.
    """
    primary = db_alias()
    if connections[primary].in_atomic_block:
        return primary
    return health().used


def health() -> ReadHealth:
    """Where reads go for the current primary, probed at most every ``VERDICT_SECONDS``."""
    primary = db_alias()
    replica = replica_of(primary)
    if replica is None:
        return ReadHealth(primary, None, primary, "none")
    key = (primary, replica, generation("DISPATCH"))
    now = time.monotonic()
    with _lock:  # one probe at a time: the pages waiting for it then share its verdict
        cached = _verdicts.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        verdict = _probe(primary, replica)
        _verdicts[key] = (time.monotonic() + VERDICT_SECONDS, verdict)
    return verdict


def forget() -> None:
    """Drop the kept verdicts: the next read probes again (tests; after a failover)."""
    with _lock:
        _verdicts.clear()


class _NotAStandby(Exception):
    """The replica answers, but replays nothing: a promoted old replica, or a server
    of its own. Its data may have diverged from the primary's, so it serves nothing."""


def _probe(primary: str, replica: str) -> ReadHealth:
    max_lag = get_settings().READ_MAX_LAG
    try:
        lag, behind, detail = _measure(primary, replica)
    except _NotAStandby as e:
        return ReadHealth(primary, replica, primary, "not a standby", detail=str(e))
    except Exception as e:  # any failure to reach it or ask it: it serves nothing
        text = " ".join(str(e).split()) or type(e).__name__
        # This thread's connection to it is dead or soon will be: closed, the next
        # read after a healthy verdict connects afresh instead of failing on it.
        with contextlib.suppress(Exception):
            connections[replica].close()
        return ReadHealth(primary, replica, primary, "down", detail=text[:300])
    if lag is not None and lag > max_lag:
        behind_by = detail or f"{lag:.1f} s behind"
        detail = f"{behind_by}, more than READ_MAX_LAG ({max_lag:g} s)"
        return ReadHealth(primary, replica, primary, "lagging", lag, behind, detail)
    return ReadHealth(primary, replica, replica, "ok", lag, behind, detail)


def _measure(primary: str, replica: str) -> tuple[float | None, int | None, str]:
    """(lag in seconds, WAL bytes behind, a note) of ``replica``; raises when unreachable."""
    if connections[replica].vendor != "postgresql":
        with connections[replica].cursor() as cursor:  # reachable; no lag to measure
            cursor.execute("SELECT 1")
        return None, None, "lag not measured (not PostgreSQL)"
    with connections[primary].cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_flush_lsn()::text")
        primary_lsn = cursor.fetchone()[0]
    with _probe_connection(replica) as conn:
        row = conn.execute(
            "SELECT pg_is_in_recovery(), "
            "pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_replay_lsn())::bigint, "
            "extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8",
            [primary_lsn],
        ).fetchone()
    assert row is not None
    in_recovery, behind, age = row
    if not in_recovery:
        raise _NotAStandby(
            "pg_is_in_recovery() is false: a promoted or independent server, whose data "
            "may have left the primary's behind; point READ_DATABASE at a streaming replica"
        )
    if behind is not None and behind <= 0:
        return 0.0, 0, ""
    if age is None:  # behind, and nothing replayed since it started: no bound on its age
        return float("inf"), behind, f"{behind} bytes behind and nothing replayed yet"
    return max(float(age), 0.0), behind, ""


def _probe_connection(replica: str) -> Any:
    """A connection of its own to ``replica``, which gives up after ``PROBE_TIMEOUT``.

    Not Django's connection: its connect timeout is the site's (often none,
    and a replica behind a dropped network link would hold the page for
    minutes), and a probe must not leave a statement timeout on it.
    """
    import psycopg

    params = dict(connections[replica].get_connection_params())
    timeout = int(max(PROBE_TIMEOUT, 1))
    configured = params.get("connect_timeout")
    params["connect_timeout"] = min(int(configured), timeout) if configured else timeout
    limit = f"-c statement_timeout={int(PROBE_TIMEOUT * 1000)}"
    params["options"] = f"{params['options']} {limit}" if params.get("options") else limit
    return psycopg.connect(autocommit=True, **params)
