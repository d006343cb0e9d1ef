"""django_dispatch's ``atomic=True`` twins of ``bench.tasks``, for the atomic check.

Apart from ``tasks.py`` because ``atomic`` is django_dispatch's own option:
django-tasks-db, which imports ``bench.tasks`` too, knows nothing of it.
Same bodies, so that a drain of each against its plain twin measures only
what the one transaction costs (or saves: the realistic job's two writes and
the job's success commit once instead of three times).
"""

from django_dispatch import task


@task(atomic=True)
def noop_atomic() -> None:
    """Does nothing, inside the transaction that records its success."""


@task(atomic=True)
def realistic_atomic(seq: int) -> None:
    """``bench.tasks.realistic``'s INSERT and UPDATE, committed with the job's success."""
    from bench.orders import place_order

    place_order(seq)
