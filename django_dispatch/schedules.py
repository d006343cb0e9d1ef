"""Cron entries from code: ``save``, ``delete``, ``set_enabled``, ``get``, ``list``.

::

    from django_dispatch import schedules

    schedules.save("nightly-report", schedule="0 3 * * *", task="reports.tasks.nightly",
                   timezone="Europe/Paris")
    schedules.set_enabled("nightly-report", False)
    schedules.set_enabled("nightly-report", True, next_run_at=timezone.now() + timedelta(hours=1))

Entries saved here are never touched by the ``DISPATCH["CRON"]`` sync; a
name the settings define is refused. See ``services.schedules``.
"""

from .services.schedules import delete, get, save, set_enabled
from .services.schedules import list_entries as list

__all__ = ["delete", "get", "list", "save", "set_enabled"]
