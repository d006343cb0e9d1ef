"""The leadership lease: one holder at a time, taken over once it expires."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from ..models import Leadership
from .base import db_alias, now_plus

LEADER = "maintenance"


def leadership_acquire(
    holder: str, *, ttl: float, name: str = LEADER, db: str | None = None
) -> bool:
    """Take or renew the lease; True while ``holder`` is the leader.

    Conditional UPDATEs on the database clock: a renewal by the current
    holder, or a takeover by anyone once the lease has expired. Leadership
    only decides who runs cluster-wide maintenance; every step of it is also
    safe to run twice, so losing the lease mid-step is harmless.
    """
    db = db or db_alias()
    leases = Leadership.objects.using(db).filter(name=name)
    if leases.filter(holder=holder).update(expires_at=now_plus(ttl)):
        return True  # renewed (nobody took over since)
    if leases.filter(expires_at__lt=Now()).update(
        holder=holder, expires_at=now_plus(ttl), acquired_at=Now()
    ):
        return True  # took over an expired lease; concurrent takers serialize on the row
    if leases.exists():
        return False
    try:
        with transaction.atomic(using=db):
            Leadership.objects.using(db).create(
                name=name, holder=holder, expires_at=now_plus(ttl), acquired_at=Now()
            )
        return True
    except IntegrityError:  # another candidate created it first
        return False


def leadership_release(holder: str, *, name: str = LEADER, db: str | None = None) -> None:
    """Give the lease up (clean shutdown), so another worker takes over at once."""
    Leadership.objects.using(db or db_alias()).filter(name=name, holder=holder).update(
        expires_at=Now()
    )


def leadership_holder(*, name: str = LEADER, db: str | None = None) -> tuple[str, bool] | None:
    """(holder, still valid) of the lease, or None if nobody ever held it."""
    lease = Leadership.objects.using(db or db_alias()).filter(name=name).first()
    if lease is None:
        return None
    valid = (
        Leadership.objects.using(db or db_alias()).filter(name=name, expires_at__gt=Now()).exists()
    )
    return lease.holder, valid
