"""Retry policy, at its documented path: ``OPTIONS["BACKOFF"]`` defaults to
``"django_dispatch.retry.exponential_backoff"``. The logic is ``core.retry``."""

from .core.retry import BASE_SECONDS, CAP_SECONDS, Backoff, exponential_backoff, next_delay

__all__ = ["BASE_SECONDS", "CAP_SECONDS", "Backoff", "exponential_backoff", "next_delay"]
