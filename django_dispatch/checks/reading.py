"""The read replica: ``DISPATCH["READ_DATABASE"]`` names databases that exist, of the right kind."""

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import router

from ..core.docs_links import docs_url
from ..models import Job

SEE = f"See {docs_url('settings', 'read-replica')}"


@checks.register()
def check_read_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each replica named is in ``DATABASES``, as is each primary a dict names, and each
    replica has its primary's engine (a replica is a copy of its primary's cluster).

    The wrong type is the settings check's to report (``conf.validate``); whether the
    replica is really a standby of that primary is asked at run time, where the console
    says so (a check at start-up cannot tell that a replica will be reachable later).
    """
    raw = getattr(settings, "DISPATCH", None) or {}
    value = raw.get("READ_DATABASE") if isinstance(raw, dict) else None
    if isinstance(value, str):
        pairs = {router.db_for_write(Job): value} if value else {}
    elif isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        pairs = value
    else:
        return []
    databases = settings.DATABASES
    known = ", ".join(map(repr, databases))
    messages: list[checks.CheckMessage] = []
    for primary, replica in pairs.items():
        if primary not in databases:
            messages.append(
                checks.Error(
                    f"DISPATCH['READ_DATABASE'] gives a replica to {primary!r}, which is not "
                    f"in DATABASES ({known}).",
                    hint="Key the dict by the jobs' database alias (the default's, or a "
                    f"TASKS alias's OPTIONS['DATABASE']). {SEE}",
                    id="django_dispatch.E070",
                )
            )
        if replica not in databases:
            messages.append(
                checks.Error(
                    f"DISPATCH['READ_DATABASE'] names {replica!r}, which is not in "
                    f"DATABASES ({known}).",
                    hint="Add the replica to DATABASES (with TEST: {'MIRROR': "
                    f"{primary!r}}} so that tests read the test database), or fix the name. "
                    f"{SEE}",
                    id="django_dispatch.E071",
                )
            )
        elif primary in databases and _engine(replica) != _engine(primary):
            messages.append(
                checks.Error(
                    f"DISPATCH['READ_DATABASE']: {replica!r} ({_engine(replica)}) cannot be a "
                    f"replica of {primary!r} ({_engine(primary)}): their engines differ.",
                    hint=f"Name a streaming replica of {primary!r}'s server. {SEE}",
                    id="django_dispatch.E072",
                )
            )
    return messages


def _engine(alias: str) -> str:
    return str(settings.DATABASES[alias].get("ENGINE", ""))
