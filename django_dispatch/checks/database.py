"""The database that holds the jobs: its vendor, its migrations, SQLite's transactions."""

import pkgutil
import sys
from importlib import import_module
from typing import Any

from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections, router
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

from ..core.docs_links import docs_url
from ..models import Job

SUPPORTED_VENDORS = {"postgresql", "sqlite"}


def jobs_db() -> str:
    """The alias of the database the jobs are written to."""
    return router.db_for_write(Job) or DEFAULT_DB_ALIAS


def unapplied_migrations(db: str) -> list[str]:
    """Names of django_dispatch migrations not applied on ``db``.

    Every worker start asks, so the common answer (all applied) comes from
    one read of the recorded migrations and the names of the migration
    files; loading every migration and planning (the authoritative answer,
    several times slower) is left to when that quick look finds a gap.
    """
    on_disk = _migration_names()
    if on_disk and on_disk <= _applied_names(db):
        return []
    executor = MigrationExecutor(connections[db])
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "django_dispatch"]
    plan = executor.migration_plan(targets)
    return [migration.name for migration, backwards in plan if not backwards]


def _migration_names() -> set[str]:
    """The migrations django_dispatch ships (or ``MIGRATION_MODULES`` names), by file,
    skipped as Django's loader skips them; empty when they cannot be listed."""
    module_name, _ = MigrationLoader.migrations_module("django_dispatch")
    if module_name is None:
        return set()
    try:
        package = import_module(module_name)
    except ImportError:
        return set()
    path = getattr(package, "__path__", None)
    if path is None:
        return set()
    return {
        info.name
        for info in pkgutil.iter_modules(path)
        if not info.ispkg and info.name[0] not in "_~"
    }


def _applied_names(db: str) -> set[str]:
    """django_dispatch's migrations recorded as applied on ``db``.

    A squashed migration is recorded under the names it replaces, so its own
    file is never in this set and the caller falls back to the full plan.
    """
    applied = MigrationRecorder(connections[db]).applied_migrations()
    return {name for app, name in applied if app == "django_dispatch"}


@checks.register(checks.Tags.database)
def check_migrations_applied(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    db = jobs_db()
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


def check_jobs_database() -> list[checks.CheckMessage]:
    """The jobs' database is one django_dispatch supports, used the way it needs."""
    db = jobs_db()
    vendor = connections[db].vendor
    messages: list[checks.CheckMessage] = []
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
