"""``TASKS[alias]["OPTIONS"]["DATABASE"]``: a database per alias, checked.

Without the database tag: the value names a database of ``DATABASES`` of
a supported engine (E080), the routers let django_dispatch's tables be
migrated there (E081), and aliases sharing a namespace share a database
(E082). With it (``check --database NAME``, ``migrate``): the tables are
there (W083, a warning: ``migrate`` runs these checks and must not be
blocked by the very problem it fixes; ``rundispatch`` refuses to start).
"""

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import router

from ..core.docs_links import docs_url
from ..store.base import database_for
from .aliases import dispatch_backend_options
from .database import SUPPORTED_VENDORS, jobs_db, unapplied_migrations

SEE = f"See {docs_url('deployment', 'an-alias-per-database')}"


def configured_databases() -> dict[str, Any]:
    """Each DispatchBackend alias's ``OPTIONS["DATABASE"]`` as written, where it is set."""
    return {
        alias: options["DATABASE"]
        for alias, options in dispatch_backend_options().items()
        if "DATABASE" in options
    }


@checks.register()
def check_alias_databases(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E080, E081 and E082 (see the module docstring); no query."""
    messages: list[checks.CheckMessage] = []
    usable: set[str] = set()
    for alias, database in configured_databases().items():
        problem = _database_problem(database)
        if problem:
            messages.append(
                checks.Error(
                    f"TASKS[{alias!r}]['OPTIONS']['DATABASE'] {problem}.",
                    hint=f"Name a key of DATABASES (a PostgreSQL or SQLite one), or drop "
                    f"DATABASE to keep the alias's rows where the routers put them. {SEE}",
                    id="django_dispatch.E080",
                )
            )
            continue
        usable.add(alias)
        if not router.allow_migrate(database, "django_dispatch", model_name="job"):
            messages.append(
                checks.Error(
                    f"TASKS[{alias!r}]['OPTIONS']['DATABASE'] is {database!r}, but the "
                    "DATABASE_ROUTERS do not allow django_dispatch's migrations there, so "
                    "its tables can never be created on it.",
                    hint=f"Make your router's allow_migrate() return True for app_label "
                    f"'django_dispatch' on {database!r}. {SEE}",
                    id="django_dispatch.E081",
                )
            )
    messages += _shared_namespaces(usable)
    return messages


def _database_problem(database: Any) -> str | None:
    if not isinstance(database, str) or not database:
        return f"must be the name of a database (a key of DATABASES), got {database!r}"
    if database not in settings.DATABASES:
        return (
            f"is {database!r}, which is not a key of DATABASES "
            f"(DATABASES has {sorted(settings.DATABASES)})"
        )
    engine = str(settings.DATABASES[database].get("ENGINE", ""))
    if not any(vendor in engine for vendor in ("postgresql", "sqlite3")):
        return (
            f"is {database!r}, whose ENGINE {engine!r} is not one django_dispatch supports "
            f"({sorted(SUPPORTED_VENDORS)})"
        )
    return None


def _shared_namespaces(usable: set[str]) -> list[checks.CheckMessage]:
    """Aliases sharing a NAMESPACE must share a database.

    A namespace is what a worker serves, what the console and the admin's
    filters show, and what a cron entry or a dead letter records: with one
    namespace in two databases, each of those would pick one database and
    silently miss the other's rows (the admin's selector maps a namespace to
    its database). Give each database's aliases their own namespaces.
    """
    options = dispatch_backend_options()
    by_namespace: dict[str, dict[str, list[str]]] = {}
    for alias, opts in options.items():
        namespace = opts.get("NAMESPACE", "")
        if not isinstance(namespace, str) or ("DATABASE" in opts and alias not in usable):
            continue  # reported by E040 / E080
        by_namespace.setdefault(namespace, {}).setdefault(database_for(alias), []).append(alias)
    messages: list[checks.CheckMessage] = []
    for namespace, databases in sorted(by_namespace.items()):
        if len(databases) < 2:
            continue
        where = "; ".join(
            f"{', '.join(repr(a) for a in sorted(aliases))} on {db!r}"
            for db, aliases in sorted(databases.items())
        )
        messages.append(
            checks.Error(
                f"Namespace {namespace!r} is used by aliases on different databases ({where}): "
                "a namespace must live in one database.",
                hint="Give the aliases of each database a NAMESPACE of their own "
                f"(e.g. OPTIONS['NAMESPACE'] = the alias's name). {SEE}",
                id="django_dispatch.E082",
            )
        )
    return messages


@checks.register(checks.Tags.database)
def check_alias_tables(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W083: django_dispatch's migrations are applied on each alias's database
    that this check run may query (``databases``); the jobs' default database
    is W020's."""
    if not databases:
        return []
    messages: list[checks.CheckMessage] = []
    seen = {jobs_db()}
    for alias, database in sorted(configured_databases().items()):
        if database in seen or database not in databases or _database_problem(database):
            continue
        seen.add(database)
        missing = unapplied_migrations(database)
        if missing:
            messages.append(
                checks.Warning(
                    f"django_dispatch's migrations {missing} are not applied on database "
                    f"{database!r}, which TASKS[{alias!r}]['OPTIONS']['DATABASE'] names: "
                    "its tables are missing there.",
                    hint=f"Run `python manage.py migrate --database {database}`. {SEE}",
                    id="django_dispatch.W083",
                )
            )
    return messages
