"""Helpers shared by the store tests."""

from django_dispatch import store
from django_dispatch.runtime import flow_cache


def claim(worker="w1", limit=10, queues=(), lease=30.0):
    return store.jobs_claim(worker_id=worker, queues=queues, limit=limit, lease_seconds=lease)


def claim_as_worker(worker="w", limit=10, queues=(), poll_interval=1.0):
    """A claim as a worker makes it: with the flow state its process keeps
    (refreshed once per ``poll_interval``), and the notes it writes back."""
    return flow_cache.jobs_claim(
        worker_id=worker,
        queues=queues,
        limit=limit,
        lease_seconds=30,
        db=store.db_alias(),
        namespace="",
        max_age=poll_interval,
    )
