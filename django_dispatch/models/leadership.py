"""Leadership: one worker at a time runs the cluster-wide maintenance.

A lease row (holder, expiry on the database clock), renewed by its holder and
taken over by anyone once it expires. No advisory locks, so it works through
PgBouncer in transaction mode and on SQLite.
"""

from django.db import models

from .job import namespace_field


class Leadership(models.Model):
    #: The lease's key: its name for the default namespace, ``<namespace>/<name>``
    #: otherwise (see ``store.leadership.lease_key``), so each namespace has a
    #: leader of its own and the primary key keeps a lease unique per namespace.
    name = models.CharField(max_length=120, primary_key=True)
    namespace = namespace_field()
    holder = models.CharField(max_length=100)
    expires_at = models.DateTimeField()
    acquired_at = models.DateTimeField()

    class Meta:
        app_label = "django_dispatch"

    def __str__(self) -> str:
        return f"{self.name}: {self.holder}"
