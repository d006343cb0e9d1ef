"""Typed access to the ``DISPATCH`` setting, with every default in one place.

Read through ``get_settings()`` each time a value is needed (it is cheap), so
that ``override_settings`` in tests and settings changes between a task's
definition and its enqueue are honoured.
"""

from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    #: Seconds a claim is valid without renewal. A worker that stops
    #: heartbeating (SIGKILL, OOM, network partition) loses its jobs after this.
    LEASE_SECONDS: float = 30.0
    #: Seconds between lease renewals. Must be at most a third of the lease so
    #: that two missed heartbeats still leave the lease alive.
    HEARTBEAT_INTERVAL: float = 5.0
    #: Seconds between sweeps that return expired leases to the queue.
    RECLAIM_INTERVAL: float = 10.0
    #: Seconds between polls when no wake-up arrives (SQLite, LISTEN off,
    #: jobs scheduled for later).
    POLL_INTERVAL: float = 1.0
    #: Wake idle workers with PostgreSQL LISTEN/NOTIFY. Turn off behind a
    #: pooler in transaction mode (PgBouncer), where LISTEN does not work.
    LISTEN: bool = True
    #: How many times a job may lose its worker (SIGKILL, OOM, segfault)
    #: before it is failed as "worker lost" instead of run again.
    MAX_WORKER_LOST: int = 3
    #: Default worker threads per process (``--concurrency``).
    CONCURRENCY: int = 4
    #: Default grace period on SIGTERM (``--shutdown-timeout``).
    SHUTDOWN_TIMEOUT: float = 30.0
    #: Seconds after which a Worker row not seen is considered gone.
    WORKER_STALE_SECONDS: float = 300.0

    def validate(self) -> list[str]:
        """Problems with these values, each phrased as what to change."""
        problems = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in (bool, "bool"):
                if not isinstance(value, bool):
                    problems.append(f"DISPATCH['{f.name}'] must be True or False, got {value!r}.")
            elif not isinstance(value, int | float) or isinstance(value, bool):
                problems.append(f"DISPATCH['{f.name}'] must be a number, got {value!r}.")
            elif value <= 0:
                problems.append(f"DISPATCH['{f.name}'] must be positive, got {value!r}.")
        if problems:
            return problems
        if self.HEARTBEAT_INTERVAL * 3 > self.LEASE_SECONDS:
            problems.append(
                f"DISPATCH['HEARTBEAT_INTERVAL'] ({self.HEARTBEAT_INTERVAL}) must be at most a "
                f"third of DISPATCH['LEASE_SECONDS'] ({self.LEASE_SECONDS}), so that a lease "
                "survives two missed heartbeats. Lower the interval or raise the lease."
            )
        return problems


_FIELD_NAMES = {f.name for f in fields(DispatchSettings)}
#: Keys read by later subsystems (cron, retention); accepted so that the
#: unknown-key check does not reject them.
_OTHER_KEYS = {"CRON"}


def unknown_keys(raw: dict[str, Any]) -> list[str]:
    return sorted(set(raw) - _FIELD_NAMES - _OTHER_KEYS)


def get_settings() -> DispatchSettings:
    raw: dict[str, Any] = getattr(settings, "DISPATCH", None) or {}
    return DispatchSettings(**{k: v for k, v in raw.items() if k in _FIELD_NAMES})
