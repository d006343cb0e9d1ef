"""Helpers shared by the store tests."""

from django_dispatch import store


def claim(worker="w1", limit=10, queues=(), lease=30.0):
    return store.jobs_claim(worker_id=worker, queues=queues, limit=limit, lease_seconds=lease)
