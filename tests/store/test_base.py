"""The store's shared expressions (store/base.py)."""

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from django_dispatch.models import Leadership
from django_dispatch.store.base import now_plus

pytestmark = pytest.mark.django_db(transaction=True)


def test_now_plus_zero_is_due_in_the_same_instant():
    """``now_plus(0)`` compares equal to ``now()``, in one statement (one clock
    reading on both databases). On SQLite, ``now()`` is text to the
    millisecond and a sum text to the microsecond, compared as text: "now +
    0" sorted after "now", so an artifact given ``expires_in=0`` was not yet
    expired for a sweep in the same millisecond (a flaky CI failure)."""
    Leadership.objects.create(
        name="t", holder="h", expires_at=timezone.now(), acquired_at=timezone.now()
    )
    leases = Leadership.objects.alias(at=now_plus(0))
    assert leases.filter(at__lte=Now()).exists()
    assert leases.filter(at__gte=Now()).exists()
    later = Leadership.objects.alias(at=now_plus(0.5))
    assert not later.filter(at__lte=Now()).exists()
