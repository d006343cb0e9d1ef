"""System checks: configuration mistakes reported at start-up, with ids and hints."""

import sys
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections, router
from django.db.migrations.executor import MigrationExecutor

from .conf import CRON_ENTRY_KEYS, did_you_mean, get_settings, known_keys, unknown_keys
from .docs_links import docs_url
from .models.job import NAMESPACE_RE

SUPPORTED_VENDORS = {"postgresql", "sqlite"}


def namespace_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a namespace, or None if it can."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__} {value!r}"
    if len(value) > 63:
        return f"is {len(value)} characters long; at most 63 are allowed"
    if not NAMESPACE_RE.fullmatch(value):
        bad = sorted({c for c in value if not NAMESPACE_RE.fullmatch(c)})
        return f"{value!r} contains {''.join(bad)!r}; only letters, digits, '_', '-', '.', ':'"
    return None


def _dispatch_backend_options() -> dict[str, dict[str, Any]]:
    """``TASKS`` aliases whose BACKEND is a DispatchBackend: alias -> OPTIONS.

    Read from the setting, not from built backends, so that a bad option is
    reported by the check rather than raised while building the backend.
    """
    from django.utils.module_loading import import_string

    from .enqueue import DispatchBackendBase

    found: dict[str, dict[str, Any]] = {}
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            cls = import_string(params.get("BACKEND", ""))
        except (ImportError, AttributeError, TypeError):
            continue
        if isinstance(cls, type) and issubclass(cls, DispatchBackendBase):
            options = params.get("OPTIONS") or {}
            found[alias] = options if isinstance(options, dict) else {}
    return found


@checks.register()
def check_namespaces(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each DispatchBackend alias's ``OPTIONS["NAMESPACE"]`` is a valid namespace."""
    see = f"See {docs_url('deployment', 'namespaces')}"
    messages: list[checks.CheckMessage] = []
    for alias, options in _dispatch_backend_options().items():
        problem = namespace_problem(options.get("NAMESPACE", ""))
        if problem:
            messages.append(
                checks.Error(
                    f"TASKS[{alias!r}]['OPTIONS']['NAMESPACE'] {problem}.",
                    hint=f"Use at most 63 letters, digits, '_', '-', '.' or ':'. {see}",
                    id="django_dispatch.E040",
                )
            )
    return messages


@checks.register(checks.Tags.database)
def check_abandoned_namespaces(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Live jobs in a namespace no DispatchBackend alias uses any more.

    Changing an alias's ``NAMESPACE`` while jobs of the old one are live
    leaves those jobs behind: no worker serves that namespace now, so they
    would never run (or finish). One warning per such namespace, with the
    count, so the operator moves them or points a worker at them.
    """
    from django.db.models import Count

    from .models import Job
    from .store.base import live_jobs

    db = router.db_for_write(Job) or DEFAULT_DB_ALIAS
    if not databases or db not in databases or unapplied_migrations(db):
        return []
    configured = {
        ns
        for ns in (o.get("NAMESPACE", "") for o in _dispatch_backend_options().values())
        if isinstance(ns, str)
    }
    if not configured:
        return []
    left = (
        Job.objects.using(db)
        .filter(live_jobs())
        .exclude(namespace__in=configured)
        .values("namespace")
        .annotate(count=Count("id"))
        .order_by("namespace")
    )
    return [
        checks.Warning(
            f"{row['count']} live jobs are in namespace {row['namespace']!r}, which no "
            f"DispatchBackend alias uses (configured: {sorted(configured)}); no worker "
            "will run them.",
            hint=(
                "Give an alias that NAMESPACE again and run `rundispatch --backend ALIAS` "
                "until they are done, or move them (see "
                f"{docs_url('deployment', 'namespaces')})."
            ),
            id="django_dispatch.W041",
        )
        for row in left
    ]


@checks.register()
def check_dispatch_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    raw = getattr(settings, "DISPATCH", None) or {}
    if not isinstance(raw, dict):
        return [
            checks.Error(
                f"DISPATCH must be a dict, got {type(raw).__name__}.",
                hint=f"Every key is optional; see {docs_url('settings', 'dispatch')}",
                id="django_dispatch.E010",
            )
        ]
    # One error per key, each with its own suggestion: a typo is otherwise
    # silently ignored and the default applies.
    known = known_keys()
    messages += [
        checks.Error(
            f"DISPATCH has an unknown key {key!r}.{did_you_mean(key, known)}",
            hint=f"The keys django_dispatch reads are listed at {docs_url('settings', 'dispatch')}",
            id="django_dispatch.E011",
        )
        for key in unknown_keys(raw)
    ]
    try:
        problems = get_settings().validate()
    except TypeError as e:
        problems = [f"DISPATCH has a value of the wrong type: {e}"]
    messages += [
        checks.Error(p, hint=f"See {docs_url('settings', 'validation')}", id="django_dispatch.E012")
        for p in problems
    ]
    cron_entries = raw.get("CRON", {})
    if isinstance(cron_entries, dict):
        messages += _check_cron_entries(cron_entries)
    from .models import Job

    db = router.db_for_write(Job) or DEFAULT_DB_ALIAS
    vendor = connections[db].vendor
    if vendor == "sqlite":
        messages += _check_sqlite_requests(db)
    if vendor not in SUPPORTED_VENDORS:
        messages.append(
            checks.Error(
                f"django_dispatch stores jobs on a {vendor} database; it supports "
                "PostgreSQL and SQLite.",
                hint="Route django_dispatch's models to a PostgreSQL or SQLite database "
                f"(see {docs_url('install')}).",
                id="django_dispatch.E013",
            )
        )
    return messages


def _check_sqlite_requests(db: str) -> list[checks.CheckMessage]:
    """ATOMIC_REQUESTS on SQLite needs transactions that start as the writer.

    A request's transaction reads (the session, the user) before any view
    code runs; on SQLite it then cannot write once a worker has committed in
    between ("database is locked" at once). The admin's own remedy, taking
    the write lock before its first read, comes too late inside it.
    """
    settings_dict = connections[db].settings_dict
    mode = str(settings_dict.get("OPTIONS", {}).get("transaction_mode") or "").upper()
    if not settings_dict.get("ATOMIC_REQUESTS") or mode in ("IMMEDIATE", "EXCLUSIVE"):
        return []
    return [
        checks.Warning(
            f"Database {db!r} is SQLite with ATOMIC_REQUESTS: requests that read and then "
            "write (admin actions among them) fail with 'database is locked' whenever a "
            "worker commits in between.",
            hint=f"Set DATABASES[{db!r}]['OPTIONS']['transaction_mode'] = 'IMMEDIATE', "
            "or turn ATOMIC_REQUESTS off. See "
            f"{docs_url('operating', 'the-admin-on-sqlite-beside-busy-workers')}",
            id="django_dispatch.W014",
        )
    ]


def unapplied_migrations(db: str) -> list[str]:
    """Names of django_dispatch migrations not applied on ``db``."""
    executor = MigrationExecutor(connections[db])
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "django_dispatch"]
    plan = executor.migration_plan(targets)
    return [migration.name for migration, backwards in plan if not backwards]


@checks.register(checks.Tags.database)
def check_migrations_applied(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    from .models import Job

    db = router.db_for_write(Job) or DEFAULT_DB_ALIAS
    if not databases or db not in databases:
        return []
    if sys.argv[1:2] == ["migrate"]:  # about to fix it: do not tell the user to run it
        return []
    missing = unapplied_migrations(db)
    if not missing:
        return []
    # A warning, not an error: ``migrate`` runs database checks too, and must
    # not be blocked by the very problem it fixes. The worker refuses to start.
    return [
        checks.Warning(
            f"django_dispatch's migrations {missing} are not applied on database {db!r}.",
            hint="Run `python manage.py migrate django_dispatch`.",
            id="django_dispatch.W020",
        )
    ]


def _check_cron_entries(entries: dict[str, Any]) -> list[checks.CheckMessage]:
    """Each DISPATCH["CRON"] entry: a valid schedule, time zone, policy and task."""
    from django.utils.module_loading import import_string

    from . import cron
    from .compat import Task

    messages: list[checks.CheckMessage] = []
    see = f"See {docs_url('scheduling', 'declaring-entries-in-settings')}"
    for name, spec in entries.items():
        where = f"DISPATCH['CRON'][{name!r}]"
        if not isinstance(spec, dict):
            messages.append(
                checks.Error(
                    f"{where} must be a dict with at least 'schedule' and 'task', "
                    f"got {type(spec).__name__}.",
                    hint=see,
                    id="django_dispatch.E030",
                )
            )
            continue
        # Unknown keys first: a misspelt 'schedule' is reported as the typo
        # it is, not only as a missing key; a misspelt optional key
        # ('timzone') would otherwise be ignored and its default used.
        for key in sorted(set(spec) - set(CRON_ENTRY_KEYS), key=str):
            messages.append(
                checks.Error(
                    f"{where} has an unknown key {key!r}.{did_you_mean(key, CRON_ENTRY_KEYS)}",
                    hint=f"An entry's keys are {', '.join(map(repr, CRON_ENTRY_KEYS))}. {see}",
                    id="django_dispatch.E035",
                )
            )
        missing = [key for key in ("schedule", "task") if key not in spec]
        if missing:
            messages.append(
                checks.Error(
                    f"{where} must be a dict with at least 'schedule' and 'task'; "
                    f"{' and '.join(map(repr, missing))} missing.",
                    hint=see,
                    id="django_dispatch.E030",
                )
            )
            continue
        try:
            cron.validate(spec["schedule"], spec.get("timezone") or settings.TIME_ZONE)
        except cron.CronError as e:
            messages.append(checks.Error(f"{where}: {e}", hint=see, id="django_dispatch.E031"))
        for key, kind in (("args", list), ("kwargs", dict), ("queue_name", str)):
            if key in spec and not isinstance(spec[key], kind):
                messages.append(
                    checks.Error(
                        f"{where}: {key!r} must be a {kind.__name__}, got {spec[key]!r}.",
                        hint=see,
                        id="django_dispatch.E034",
                    )
                )
        priority = spec.get("priority", 0)
        if (
            not isinstance(priority, int)
            or isinstance(priority, bool)
            or not -100 <= priority <= 100
        ):
            messages.append(
                checks.Error(
                    f"{where}: 'priority' must be a whole number from -100 to 100, "
                    f"got {priority!r}.",
                    hint=see,
                    id="django_dispatch.E034",
                )
            )
        alias = spec.get("backend", "default")
        if alias not in _dispatch_backend_options():
            messages.append(
                checks.Error(
                    f"{where}: 'backend' {alias!r} is not a TASKS alias using DispatchBackend "
                    f"(those are {sorted(_dispatch_backend_options())}).",
                    hint=see,
                    id="django_dispatch.E036",
                )
            )
        policy = spec.get("misfire_policy", cron.SKIP)
        if policy not in cron.POLICIES:
            messages.append(
                checks.Error(
                    f"{where}: misfire_policy {policy!r} is not one of {list(cron.POLICIES)}."
                    f"{did_you_mean(policy, cron.POLICIES)}",
                    hint=f"See {docs_url('scheduling', 'missed-slots-misfire-policies')}",
                    id="django_dispatch.E032",
                )
            )
        try:
            task = import_string(spec["task"])
        except ImportError as e:
            messages.append(
                checks.Error(
                    f"{where}: task {spec['task']!r} cannot be imported ({e}).",
                    hint="Give the import path of a function decorated with @task.",
                    id="django_dispatch.E033",
                )
            )
            continue
        if not isinstance(task, Task):
            messages.append(
                checks.Error(
                    f"{where}: {spec['task']!r} is not a Task; decorate it with @task.",
                    hint=see,
                    id="django_dispatch.E033",
                )
            )
    return messages


@checks.register()
def check_artifact_storage(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``DISPATCH["ARTIFACT_STORAGE"]``, when set, names a ``STORAGES`` alias (else every
    save fails). Left at its default, a site without ``STORAGES["default"]`` is not
    refused here: it may never save an artifact, and a save says what is missing."""
    raw = getattr(settings, "DISPATCH", None) or {}
    if not isinstance(raw, dict) or "ARTIFACT_STORAGE" not in raw:
        return []
    alias = raw["ARTIFACT_STORAGE"]
    known = list(getattr(settings, "STORAGES", None) or {})
    if isinstance(alias, str) and alias in known:
        return []
    return [
        checks.Error(
            f"DISPATCH['ARTIFACT_STORAGE'] is {alias!r}, which is not a key of STORAGES "
            f"({', '.join(map(repr, known)) or 'none'}).",
            hint="Add that alias to STORAGES or name one of its keys; see "
            f"{docs_url('artifacts', 'storage')}",
            id="django_dispatch.E050",
        )
    ]


@checks.register()
def check_queue_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``DISPATCH["QUEUES"]`` (#17): a dict of queue name -> ``{"concurrency": N,
    "rate_limit": "N/unit"}`` for queues a DispatchBackend allows.

    Not to be confused with ``TASKS[alias]["QUEUES"]``, Django's list of
    allowed names: a limit on a queue no backend allows would limit nothing,
    so it is reported rather than ignored.
    """
    from .enqueue import backend_for, dispatch_aliases
    from .flow_options import queue_limit_problems

    raw = getattr(settings, "DISPATCH", None) or {}
    if not isinstance(raw, dict) or "QUEUES" not in raw:
        return []
    see = f"See {docs_url('settings', 'queue-limits')}"
    queues = raw["QUEUES"]
    if not isinstance(queues, dict):
        return [
            checks.Error(
                f"DISPATCH['QUEUES'] must be a dict of queue name -> limits, such as "
                f"{{'emails': {{'rate_limit': '10/s', 'concurrency': 5}}}}, got "
                f"{type(queues).__name__} {queues!r}. (The list of allowed queue names "
                "is TASKS[alias]['QUEUES'], a different setting.)",
                hint=see,
                id="django_dispatch.E060",
            )
        ]
    messages: list[checks.CheckMessage] = [
        checks.Error(message, hint=see, id=f"django_dispatch.{check_id}")
        for name, spec in queues.items()
        for check_id, message in queue_limit_problems(name, spec)
    ]
    allowed: set[str] = set()
    any_name = False
    for alias in dispatch_aliases():
        backend = backend_for(alias)
        names = getattr(backend, "queues", None)
        if not names:
            any_name = True
        else:
            allowed |= set(names)
    if not any_name:
        for name in sorted((n for n in queues if isinstance(n, str)), key=str):
            if name not in allowed:
                messages.append(
                    checks.Error(
                        f"DISPATCH['QUEUES'] has limits for queue {name!r}, which no "
                        f"DispatchBackend allows (TASKS[...]['QUEUES']: {sorted(allowed)}); "
                        f"they would limit nothing.{did_you_mean(name, allowed)}",
                        hint=f"Add {name!r} to TASKS[alias]['QUEUES'] or fix the name. {see}",
                        id="django_dispatch.E064",
                    )
                )
    return messages
