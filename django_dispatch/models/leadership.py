"""Leadership: one worker at a time runs the cluster-wide maintenance.

A lease row (holder, expiry on the database clock), renewed by its holder and
taken over by anyone once it expires. No advisory locks, so it works through
PgBouncer in transaction mode and on SQLite.
"""

from django.db import models


class Leadership(models.Model):
    name = models.CharField(max_length=50, primary_key=True)
    holder = models.CharField(max_length=100)
    expires_at = models.DateTimeField()
    acquired_at = models.DateTimeField()

    class Meta:
        app_label = "django_dispatch"

    def __str__(self) -> str:
        return f"{self.name}: {self.holder}"
