"""Queue limits: ``DISPATCH["QUEUES"]``, the concurrency and rate of each queue."""

from typing import Any

from django.conf import settings
from django.core import checks

from ..conf import did_you_mean, queue_limit_problems
from ..core.docs_links import docs_url

SEE = f"See {docs_url('settings', 'queue-limits')}"


@checks.register()
def check_queue_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``DISPATCH["QUEUES"]``: a dict of queue name -> ``{"concurrency": N,
    "rate_limit": "N/unit"}`` for queues a DispatchBackend allows.

    Not to be confused with ``TASKS[alias]["QUEUES"]``, Django's list of
    allowed names: a limit on a queue no backend allows would limit nothing,
    so it is reported rather than ignored.
    """

    raw = getattr(settings, "DISPATCH", None) or {}
    if not isinstance(raw, dict) or "QUEUES" not in raw:
        return []
    queues = raw["QUEUES"]
    if not isinstance(queues, dict):
        return [
            checks.Error(
                f"DISPATCH['QUEUES'] must be a dict of queue name -> limits, such as "
                f"{{'emails': {{'rate_limit': '10/s', 'concurrency': 5}}}}, got "
                f"{type(queues).__name__} {queues!r}. (The list of allowed queue names "
                "is TASKS[alias]['QUEUES'], a different setting.)",
                hint=SEE,
                id="django_dispatch.E060",
            )
        ]
    messages: list[checks.CheckMessage] = [
        checks.Error(message, hint=SEE, id=f"django_dispatch.{check_id}")
        for name, spec in queues.items()
        for check_id, message in queue_limit_problems(name, spec)
    ]
    return messages + _check_queues_allowed(queues)


def _allowed_queue_names() -> set[str] | None:
    """The queue names some DispatchBackend allows; None if one allows any name."""
    from ..tasks.registry import backend_for, dispatch_aliases

    allowed: set[str] = set()
    any_name = False
    for alias in dispatch_aliases():
        names = getattr(backend_for(alias), "queues", None)
        if not names:
            any_name = True
        else:
            allowed |= set(names)
    return None if any_name else allowed


def _check_queues_allowed(queues: dict[Any, Any]) -> list[checks.CheckMessage]:
    """A limit on a queue no backend allows would limit nothing."""
    allowed = _allowed_queue_names()
    if allowed is None:
        return []
    return [
        checks.Error(
            f"DISPATCH['QUEUES'] has limits for queue {name!r}, which no "
            f"DispatchBackend allows (TASKS[...]['QUEUES']: {sorted(allowed)}); "
            f"they would limit nothing.{did_you_mean(name, allowed)}",
            hint=f"Add {name!r} to TASKS[alias]['QUEUES'] or fix the name. {SEE}",
            id="django_dispatch.E064",
        )
        for name in sorted((n for n in queues if isinstance(n, str)), key=str)
        if name not in allowed
    ]
