"""Dead letters, read from code: ``list``, ``count`` and ``for_job`` (see ``queries.lists``).

::

    from django_dispatch import dead_letters, replay

    for letter in dead_letters.list(replayed=False, limit=20):
        print(letter.task_path, letter.error_class, letter.error_message)
    letter = dead_letters.for_job(result.id)   # None until the job failed for good
"""

from .queries.lists import dead_letter_for_job as for_job
from .queries.lists import dead_letters_count as count
from .queries.lists import dead_letters_list as list

__all__ = ["count", "for_job", "list"]
