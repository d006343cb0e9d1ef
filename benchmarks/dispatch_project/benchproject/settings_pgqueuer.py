"""Django in PgQueuer's worker processes, for its ORM job rows.

What a Django site running its jobs on PgQueuer has: the site's settings
(the same database and ``CONN_MAX_AGE`` as the other Django systems) in a
process that ``QueueManager`` runs, and job bodies that call the ORM through
``asgiref.sync.sync_to_async``. Only the benchmark's app: PgQueuer keeps its
jobs in its own table, and ``bench_order`` is created by the harness.
"""

from .settings import *  # noqa: F403

INSTALLED_APPS = ["bench"]
TASKS = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
