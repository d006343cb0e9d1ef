"""The leadership lease: one holder at a time per namespace, taken over once it expires.

Each namespace elects its own leader: the lease row of ``name`` in namespace
``ns`` has the key ``lease_key(name, ns)`` (the bare name in the default
namespace, so a site without namespaces keeps its one lease row), so two
namespaces never contend for, nor see, each other's lease.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from ..models import Leadership
from .base import db_alias, now_plus

LEADER = "maintenance"


def lease_key(name: str, namespace: str = "") -> str:
    """The primary key of lease ``name`` in ``namespace``."""
    return f"{namespace}/{name}" if namespace else name


def leadership_acquire(
    holder: str, *, ttl: float, name: str = LEADER, db: str | None = None, namespace: str = ""
) -> bool:
    """Take or renew the lease; True while ``holder`` is the leader.

    Conditional UPDATEs on the database clock: a renewal by the current
    holder, or a takeover by anyone once the lease has expired. Leadership
    only decides who runs cluster-wide maintenance; every step of it is also
    safe to run twice, so losing the lease mid-step is harmless.
    """
    db = db or db_alias()
    key = lease_key(name, namespace)
    leases = Leadership.objects.using(db).filter(name=key)
    if leases.filter(holder=holder).update(expires_at=now_plus(ttl)):
        return True  # renewed (nobody took over since)
    # Expired means ``expires_at <= now``, the complement of ``leadership_holder``'s
    # "valid while > now": a lease that ends exactly now is free (on SQLite's
    # millisecond clock an acquire often reads the instant a lease ended).
    if leases.filter(expires_at__lte=Now()).update(
        holder=holder, expires_at=now_plus(ttl), acquired_at=Now()
    ):
        return True  # took over an expired lease; concurrent takers serialize on the row
    if leases.exists():
        return False
    try:
        with transaction.atomic(using=db):
            Leadership.objects.using(db).create(
                name=key,
                namespace=namespace,
                holder=holder,
                expires_at=now_plus(ttl),
                acquired_at=Now(),
            )
        return True
    except IntegrityError:  # another candidate created it first
        return False


def leadership_release(
    holder: str, *, name: str = LEADER, db: str | None = None, namespace: str = ""
) -> bool:
    """Give the lease up (clean shutdown), so another worker takes over at once.

    The row goes: a lease left to expire is what a crashed or frozen leader
    leaves behind, and operators read "(lease expired)" as that; after a
    clean stop there is simply no leader until the next worker's tick.
    Only ``holder``'s own lease is deleted: one taken over meanwhile stays.
    Returns whether it held it.
    """
    deleted, _ = (
        Leadership.objects.using(db or db_alias())
        .filter(name=lease_key(name, namespace), holder=holder)
        .delete()
    )
    return deleted > 0


def leadership_holder(
    *, name: str = LEADER, db: str | None = None, namespace: str = ""
) -> tuple[str, bool] | None:
    """(holder, still valid) of ``namespace``'s lease, or None if nobody ever held it."""
    leases = Leadership.objects.using(db or db_alias()).filter(name=lease_key(name, namespace))
    lease = leases.first()
    if lease is None:
        return None
    valid = leases.filter(expires_at__gt=Now()).exists()
    return lease.holder, valid
