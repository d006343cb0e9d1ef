"""Jobs, read from code: ``list`` and ``count`` (see ``queries.lists``).

::

    from django_dispatch import jobs

    failed = jobs.list(state="failed", task="shop.tasks.send_welcome", limit=50)
    older = jobs.list(state="failed", before=failed[-1].pk)   # the next page
    jobs.count(queue="emails")
"""

from .queries.lists import jobs_count as count
from .queries.lists import jobs_list as list

__all__ = ["count", "list"]
