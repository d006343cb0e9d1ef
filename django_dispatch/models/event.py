"""Events: named, optionally keyed JSON messages published in the caller's transaction.

One table serves two deliveries (see docs/events.md):

* queue semantics, ``events.subscribe``: the oldest unacked event of a name
  is leased to one subscriber at a time (``lease_expires_at``) until it is
  acked (``acked_at``), so each event is handled once; an unacked one comes
  back to others when its lease runs out;
* signal semantics, workflow waits: every run waiting on the event's
  ``(name, key)`` gets its own copy of the payload; nothing is acked.

Invariants: ``acked_at`` is set once, by a compare-and-set
(``store.events.event_ack``); rows are deleted only by the retention purge,
after they were acked. Only ``django_dispatch.store.events`` writes rows.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .job import KEY_MAX_LENGTH, namespace_field

__all__ = ["Event"]

#: Longest event name (and workflow wait name): checked before insert.
EVENT_NAME_MAX_LENGTH = 200


class Event(models.Model):
    #: What ``events.publish`` returned.
    id = models.BigAutoField(primary_key=True)
    namespace = namespace_field()
    name = models.CharField(max_length=EVENT_NAME_MAX_LENGTH)
    key = models.CharField(max_length=KEY_MAX_LENGTH, null=True, blank=True)
    payload = models.JSONField(null=True, blank=True)
    published_at = models.DateTimeField(db_default=Now())
    acked_at = models.DateTimeField(null=True, blank=True)
    #: Leased to a subscriber until then (None: never delivered); database clock.
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    #: How many times ``subscribe`` handed it out (more than 1: redelivered).
    deliveries = models.PositiveIntegerField(default=0)

    class Meta:
        app_label = "django_dispatch"
        ordering = ["-id"]
        permissions = [("publish_event", "Can publish events")]
        indexes = [
            # subscribe: the oldest unacked event of a name (partial: acked rows cost nothing).
            models.Index(
                "namespace",
                "name",
                "id",
                name="dispatch_event_unacked",
                condition=Q(acked_at__isnull=True),
            ),
            # a workflow wait's look-back: events of (name, key) published since its run began.
            models.Index("namespace", "name", "key", "published_at", name="dispatch_event_key"),
            # the retention purge of events nobody acked, oldest first.
            models.Index(
                "namespace",
                "published_at",
                name="dispatch_event_unacked_age",
                condition=Q(acked_at__isnull=True),
            ),
            # the retention purge.
            models.Index(
                "namespace",
                "acked_at",
                name="dispatch_event_acked",
                condition=Q(acked_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        key = f" [{self.key}]" if self.key is not None else ""
        return f"{self.name}{key} #{self.pk}"
