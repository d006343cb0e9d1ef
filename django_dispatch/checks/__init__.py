"""System checks: configuration mistakes reported at start-up, with ids and hints.

One module per subject. Importing this package imports each of them, which
registers their checks with Django (``DispatchConfig.ready`` does it); Python
imports a module once, so each check is registered once.
"""

from .alias_databases import check_alias_databases, check_alias_tables
from .artifacts import check_artifact_storage
from .database import SUPPORTED_VENDORS, check_migrations_applied, unapplied_migrations
from .namespaces import check_abandoned_namespaces, check_namespaces, namespace_problem
from .queues import check_queue_limits
from .reading import check_read_database
from .settings import check_dispatch_settings
from .workflows import check_step_routes

__all__ = [
    "SUPPORTED_VENDORS",
    "check_abandoned_namespaces",
    "check_alias_databases",
    "check_alias_tables",
    "check_artifact_storage",
    "check_dispatch_settings",
    "check_migrations_applied",
    "check_namespaces",
    "check_queue_limits",
    "check_read_database",
    "check_step_routes",
    "namespace_problem",
    "unapplied_migrations",
]
