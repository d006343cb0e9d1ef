"""Typed access to the ``DISPATCH`` setting, with every default in one place.

Read through ``get_settings()`` each time a value is needed (it is cheap), so
that ``override_settings`` in tests and settings changes between a task's
definition and its enqueue are honoured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

# Re-exported: the checks and the store read them from here.
from ..core.queue_limits import QUEUE_LIMIT_KEYS as QUEUE_LIMIT_KEYS
from ..core.queue_limits import QueueLimit as QueueLimit
from ..core.queue_limits import queue_limit_problems as queue_limit_problems
from ..core.rates import parse_rate
from ..core.resources import check_capacity
from ..core.suggest import closest as closest
from ..core.suggest import did_you_mean as did_you_mean

DAY = 86400.0
KIB = 1024
MIB = 1024 * KIB


def _default_retention() -> dict[str, float | None]:
    return {"succeeded": 7 * DAY, "failed": 30 * DAY, "cancelled": 7 * DAY}


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
    #: Run a job again, without spending an attempt, when its database
    #: connection broke under its task code (restart, failover, PgBouncer
    #: restart); counted against MAX_WORKER_LOST instead. False: such a
    #: failure is an ordinary exception under the task's retry policy.
    RETRY_ON_CONNECTION_LOSS: bool = True
    #: Default worker threads per process (``--concurrency``).
    CONCURRENCY: int = 4
    #: Default grace period on SIGTERM (``--shutdown-timeout``).
    SHUTDOWN_TIMEOUT: float = 30.0
    #: Seconds a running job gets to stop on its own once asked (over its
    #: timeout, or cancelled) before ``rundispatch`` recycles its process to
    #: end it (see docs/tasks.md#timeouts).
    TIMEOUT_GRACE: float = 10.0
    #: Seconds after which a Worker row not seen is considered gone.
    WORKER_STALE_SECONDS: float = 300.0
    #: Seconds between scheduler ticks (cron entries), on every worker.
    SCHEDULER_INTERVAL: float = 1.0
    #: Seconds between retention purges (run by the leader only).
    PURGE_INTERVAL: float = 60.0
    #: Rows deleted per purge statement: bounds how long a purge holds locks.
    PURGE_BATCH: int = 1000
    #: Seconds a purge sleeps between two batches (0: none), so that a purge
    #: catching up on a large history leaves the database to the claims.
    PURGE_PAUSE: float = 0.05
    #: The list functions' counts are exact up to this many rows; above, on
    #: PostgreSQL, the planner's estimate ("about N"): see queries.counting.
    #: Each count past it walks this many index entries (about 0.25 us each),
    #: so this bounds what a count costs on a history of any size.
    COUNT_EXACT_MAX: int = 5_000
    #: Seconds a dead letter is kept.
    DEAD_LETTER_RETENTION: float = 90 * DAY
    #: Seconds an event handed out by ``events.subscribe`` stays with its
    #: subscriber; not acked by then, it is delivered again.
    EVENT_LEASE_SECONDS: float = 30.0
    #: Seconds an acked event is kept before the leader purges it.
    EVENT_RETENTION: float = 7 * DAY
    EVENT_UNACKED_RETENTION: float | None = 30 * DAY  # the same, unacked; None: forever
    #: Seconds a finished (succeeded or cancelled) workflow run and its steps
    #: are kept after it finished; the leader purges them in batches.
    WORKFLOW_RETENTION: float = 30 * DAY
    #: Seconds finished jobs are kept, per final state; None keeps them forever.
    JOB_RETENTION: dict[str, float | None] = field(default_factory=_default_retention)
    #: Largest JSON, in bytes, of one job's arguments (args and kwargs
    #: together). A bigger call is refused at enqueue (InvalidTaskArguments).
    MAX_ARGS_BYTES: int = MIB
    #: Largest JSON, in bytes, of a job's return value. A bigger one fails the
    #: job at completion, without retry (the same code returns it again).
    MAX_RESULT_BYTES: int = 10 * MIB
    #: Largest JSON, in bytes, of a checkpoint: ``context.progress()`` raises
    #: InvalidTaskArguments for a bigger one, and saves nothing.
    MAX_CHECKPOINT_BYTES: int = 10 * MIB
    #: Longest error message, and longest traceback, kept per failed attempt
    #: (UTF-8 bytes). Longer ones are cut in the middle, not refused.
    MAX_ERROR_BYTES: int = 64 * KIB
    #: Cron entries: {name: {"schedule", "task", "args", "kwargs", "timezone",
    #: "queue_name", "priority", "misfire_policy", "enabled"}}.
    CRON: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Seconds a usage record (``JobUsage``, one per attempt) is kept.
    USAGE_RETENTION: float = 30 * DAY
    #: Which attempts get a usage record: "all", "failures" (every attempt
    #: but a success) or "off". A success's record is a row inserted by the
    #: statement that finishes its wave: about a tenth of the database's CPU
    #: per job in a drain of short jobs (docs/performance.md).
    USAGE: str = "all"
    #: This worker's capacity (``rundispatch --capacity``), e.g.
    #: ``{"memory_mb": 8192, "gpu": 1}``; empty: it runs only jobs without needs.
    CAPACITY: dict[str, int] = field(default_factory=dict)
    #: This worker's locality (``rundispatch --locality``); "": none.
    LOCALITY: str = ""
    #: Seconds a job with resource needs may wait, while a worker that could
    #: hold it keeps taking smaller jobs, before that worker stops taking
    #: them until the big job fits (the starvation bound, docs/tasks.md).
    RESOURCE_STARVATION_SECONDS: float = 60.0
    #: The STORAGES alias that ``context.save_artifact`` writes to.
    ARTIFACT_STORAGE: str = "default"
    #: Dotted path to a function ``(text) -> text`` applied to every stored and
    #: logged error message and traceback (e.g. to keep personal data out of
    #: them); "" for none.
    ERROR_REDACTOR: str = ""
    #: Dotted path to a function ``() -> dict | None`` giving the call context
    #: of an enqueue that sets none (``task.using(call_context=)``); "": none.
    CALL_CONTEXT: str = ""
    #: Seconds after which an ephemeral artifact with no link (its attempt lost
    #: its lease or crashed before linking) is soft-deleted. Longer than any write.
    ARTIFACT_ORPHAN_SECONDS: float = DAY
    #: Seconds a soft-deleted artifact is kept before its file and record are purged.
    ARTIFACT_PURGE_GRACE: float = DAY
    #: Queue-level limits: ``{queue: {"concurrency": N, "rate_limit": "N/unit"}}``,
    #: per namespace, read by every claim (``flow_options.queue_limits``). Not
    #: ``TASKS[alias]["QUEUES"]``, Django's list of allowed queue names.
    QUEUES: dict[str, Any] = field(default_factory=dict)
    #: Most inputs one ``ctx.map()`` call takes: one child run each, all
    #: inserted in the step's transaction. A longer list fails the step.
    MAP_MAX_ITEMS: int = 10_000
    #: The ``DATABASES`` alias of a streaming replica of the jobs' database, which
    #: operators' reads use (the console, the admin's change lists, the list
    #: functions); "" for none. A dict ``{jobs' database: its replica}`` names one
    #: per database when TASKS aliases have databases of their own. Claims, writes
    #: and the reads that decide a write never use it.
    READ_DATABASE: str | dict[str, str] = ""
    #: Seconds the READ_DATABASE replica may lag behind its primary; further behind
    #: (or down), reads go to the primary until it catches up.
    READ_MAX_LAG: float = 30.0

    @staticmethod
    def _validate_mapping(name: str, value: Any) -> list[str]:
        if not isinstance(value, dict):
            return [f"DISPATCH['{name}'] must be a dict, got {value!r}."]
        if name != "JOB_RETENTION":
            return []
        problems = []
        for state, seconds in value.items():
            if state not in ("succeeded", "failed", "cancelled"):
                problems.append(
                    f"DISPATCH['JOB_RETENTION'] has unknown state {state!r}; use "
                    "'succeeded', 'failed' or 'cancelled'."
                )
            elif seconds is not None and (
                not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds <= 0
            ):
                problems.append(
                    f"DISPATCH['JOB_RETENTION'][{state!r}] must be positive seconds or None "
                    f"(keep forever), got {seconds!r}."
                )
        return problems

    def validate(self) -> list[str]:
        """Problems with these values, each phrased as what to change."""
        problems: list[str] = []
        wrong_type = False
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("CAPACITY", "LOCALITY"):  # checked below
                continue
            if f.name == "QUEUES" or (value is None and f.name == "EVENT_UNACKED_RETENTION"):
                continue  # QUEUES: checks.check_queue_limits; None: keep forever
            if f.name in ("JOB_RETENTION", "CRON"):
                problems += self._validate_mapping(f.name, value)
            elif f.name == "USAGE":
                if value not in USAGE_MODES:
                    problems.append(
                        f"DISPATCH['USAGE'] must be one of {', '.join(map(repr, USAGE_MODES))}, "
                        f"got {value!r}."
                    )
            elif f.name in ("ERROR_REDACTOR", "CALL_CONTEXT"):
                from .imported import path_problems

                problems += path_problems(f.name, value, _PATHS_TO[f.name])
            elif f.name == "READ_DATABASE":  # the aliases: checked by checks.reading
                problems += _read_database_problems(value)
            elif f.name == "ARTIFACT_STORAGE":  # a STORAGES alias: checked by checks.artifacts
                if not isinstance(value, str):
                    problems.append(f"DISPATCH['{f.name}'] must be a string, got {value!r}.")
            elif f.type in (bool, "bool"):
                if not isinstance(value, bool):
                    problems.append(f"DISPATCH['{f.name}'] must be True or False, got {value!r}.")
            elif not isinstance(value, int | float) or isinstance(value, bool):
                problems.append(f"DISPATCH['{f.name}'] must be a number, got {value!r}.")
                wrong_type = True
            elif value < 0 and f.name in _ZERO_ALLOWED:
                problems.append(f"DISPATCH['{f.name}'] must be 0 or more, got {value!r}.")
            elif value <= 0 and f.name not in _ZERO_ALLOWED:
                problems.append(f"DISPATCH['{f.name}'] must be positive, got {value!r}.")
            elif f.name in _WHOLE_NUMBERS and int(value) != value:
                problems.append(f"DISPATCH['{f.name}'] must be a whole number, got {value!r}.")
        problems += _resource_problems(self.CAPACITY, self.LOCALITY)
        if wrong_type:  # the comparisons below need numbers
            return problems
        if self.WORKER_STALE_SECONDS <= self.HEARTBEAT_INTERVAL * 3:
            problems.append(
                f"DISPATCH['WORKER_STALE_SECONDS'] ({self.WORKER_STALE_SECONDS}) must be more "
                f"than three heartbeats ({self.HEARTBEAT_INTERVAL * 3}), or live workers' rows "
                "would be deleted."
            )
        if self.HEARTBEAT_INTERVAL * 3 > self.LEASE_SECONDS:
            problems.append(
                f"DISPATCH['HEARTBEAT_INTERVAL'] ({self.HEARTBEAT_INTERVAL}) must be at most a "
                f"third of DISPATCH['LEASE_SECONDS'] ({self.LEASE_SECONDS}), so that a lease "
                "survives two missed heartbeats. Lower the interval or raise the lease."
            )
        return problems


def _read_database_problems(value: Any) -> list[str]:
    if isinstance(value, str):
        return []
    if isinstance(value, dict) and all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
    ):
        return []
    return [
        "DISPATCH['READ_DATABASE'] must be a DATABASES alias (a string; \"\" for none) or a "
        f"dict {{jobs' database alias: replica alias}}, got {value!r}."
    ]


def _resource_problems(capacity: Any, locality: Any) -> list[str]:
    problems = []
    try:
        check_capacity(capacity)
    except ValueError as e:
        problems.append(str(e))
    if not isinstance(locality, str):
        problems.append(f"DISPATCH['LOCALITY'] must be a string, got {locality!r}.")
    return problems


_FIELD_NAMES = {f.name for f in fields(DispatchSettings)}
#: The keys of one ``DISPATCH["CRON"]`` entry; "schedule" and "task" are required.
CRON_ENTRY_KEYS = (
    "schedule",
    "task",
    "args",
    "kwargs",
    "timezone",
    "queue_name",
    "priority",
    "misfire_policy",
    "enabled",
    "backend",  # the TASKS alias whose namespace the entry lives in (default "default")
)
#: ``DISPATCH["USAGE"]``'s values: which attempts get a usage record.
USAGE_MODES = ("all", "failures", "off")
#: The size limits, read through ``size_limit()`` (cached) on hot paths.
SIZE_LIMITS = ("MAX_ARGS_BYTES", "MAX_RESULT_BYTES", "MAX_CHECKPOINT_BYTES", "MAX_ERROR_BYTES")
#: The settings naming a function: what that function is, for their error messages.
_PATHS_TO = {
    "ERROR_REDACTOR": "a function that takes a text and returns it redacted",
    "CALL_CONTEXT": "a function that takes no argument and returns a dict or None",
}
_WHOLE_NUMBERS = {"MAX_WORKER_LOST", "CONCURRENCY", "PURGE_BATCH", "MAP_MAX_ITEMS", *SIZE_LIMITS}
_WHOLE_NUMBERS.add("COUNT_EXACT_MAX")
_ZERO_ALLOWED = {"PURGE_PAUSE"}  # numbers that may be 0; every other must be positive
_OTHER_KEYS: set[str] = set()


def known_keys() -> list[str]:
    """Every key ``DISPATCH`` may hold, sorted."""
    return sorted(_FIELD_NAMES | _OTHER_KEYS)


def unknown_keys(raw: dict[str, Any]) -> list[str]:
    return sorted(set(raw) - _FIELD_NAMES - _OTHER_KEYS, key=str)


def get_settings() -> DispatchSettings:
    raw: dict[str, Any] = getattr(settings, "DISPATCH", None) or {}
    values = {k: v for k, v in raw.items() if k in _FIELD_NAMES}
    if isinstance(values.get("JOB_RETENTION"), dict):  # partial overrides keep the defaults
        values["JOB_RETENTION"] = {**_default_retention(), **values["JOB_RETENTION"]}
    return DispatchSettings(**values)


_size_limits: dict[str, int] | None = None


def size_limit(name: str) -> int:
    """One of ``SIZE_LIMITS``, read once per settings change.

    Every enqueue checks its arguments' size, and building the whole
    ``DispatchSettings`` each time would be a measurable part of an enqueue;
    the values are kept until Django reports a change of ``DISPATCH``
    (``override_settings`` in tests sends ``setting_changed``).
    """
    global _size_limits
    limits = _size_limits
    if limits is None:
        values = get_settings()
        limits = _size_limits = {limit: getattr(values, limit) for limit in SIZE_LIMITS}
    return limits[name]


_usage_mode: str | None = None


def usage_mode() -> str:
    """``DISPATCH["USAGE"]``, read once per settings change: every wave asks."""
    global _usage_mode
    mode = _usage_mode
    if mode is None:
        mode = _usage_mode = get_settings().USAGE
    return mode


def usage_recorded(outcome: str) -> bool:
    """Whether an attempt ending as ``outcome`` (a ``JobUsage.outcome``) gets a record."""
    mode = usage_mode()
    return mode == "all" or (mode == "failures" and outcome != "succeeded")


# --- queue-level limits: DISPATCH["QUEUES"] ----------------------------------------


_queue_limits: dict[str, QueueLimit] | None = None


def queue_limits() -> dict[str, QueueLimit]:
    """The valid entries of ``DISPATCH["QUEUES"]`` that limit something, parsed.

    Read on every claim and enqueue, so kept until Django reports a change
    of ``DISPATCH`` (an empty dict on a site without queue limits: the
    claim then adds no limits gate). Entries the system checks reject
    are left out (the checks stop ``rundispatch`` from starting anyway).
    """
    global _queue_limits
    limits = _queue_limits
    if limits is None:
        raw = getattr(settings, "DISPATCH", None) or {}
        queues = raw.get("QUEUES") if isinstance(raw, dict) else None
        limits = {}
        for name, spec in (queues or {}).items() if isinstance(queues, dict) else ():
            if queue_limit_problems(name, spec):
                continue
            rate, period = parse_rate(spec["rate_limit"]) if "rate_limit" in spec else (None, None)
            if spec.get("concurrency") is not None or rate is not None:
                text = "".join(spec["rate_limit"].split()) if rate is not None else None
                limits[name] = QueueLimit(spec.get("concurrency"), rate, period, text)
        _queue_limits = limits
    return limits


# --- one receiver for every cache of a setting -------------------------------------

#: How many times Django reported a change of each setting (``override_settings`` in
#: tests). Caches above this module (backends' enqueue plans, signal senders) keep the
#: generation they were filled under and compare it, instead of listening themselves:
#: one receiver, here, sees every change, so no cache can miss one.
_generations = {"DISPATCH": 0, "TASKS": 0}


def generation(setting: str) -> int:
    """How many changes of ``setting`` (``"DISPATCH"`` or ``"TASKS"``) Django has reported."""
    return _generations[setting]


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    global _size_limits, _queue_limits, _usage_mode
    if setting not in _generations:
        return
    _generations[setting] += 1
    if setting == "DISPATCH":
        _size_limits = None
        _usage_mode = None
        _queue_limits = None
