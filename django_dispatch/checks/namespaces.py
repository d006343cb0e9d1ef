"""Namespaces: each DispatchBackend alias's ``NAMESPACE``, and live jobs left in an old one."""

from typing import Any

from django.core import checks
from django.db.models import Count

from ..core.docs_links import docs_url
from ..models import Job
from ..models.job import NAMESPACE_RE
from .aliases import dispatch_backend_options
from .database import jobs_db, unapplied_migrations


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


@checks.register()
def check_namespaces(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each DispatchBackend alias's ``OPTIONS["NAMESPACE"]`` is a valid namespace."""
    see = f"See {docs_url('deployment', 'namespaces')}"
    messages: list[checks.CheckMessage] = []
    for alias, options in dispatch_backend_options().items():
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
    from ..store.base import live_jobs

    db = jobs_db()
    if not databases or db not in databases or unapplied_migrations(db):
        return []
    configured = {
        ns
        for ns in (o.get("NAMESPACE", "") for o in dispatch_backend_options().values())
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
