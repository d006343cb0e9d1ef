"""Helpers for users' tests: run workflows through the real worker path.

Like ``django_dispatch.testing.drain()``, steps run on worker threads with
their own database connections, so test data must be committed (use
``TransactionTestCase`` or ``@pytest.mark.django_db(transaction=True)``).
"""

from __future__ import annotations

from ..store import workflows as wf_store
from ..testing import drain

RUN_STEP_PATH = "django_dispatch.workflows.tasks.run_step"


def drain_workflows(
    *, concurrency: int = 1, max_rounds: int = 1000, backend: str | None = None
) -> int:
    """Run every runnable step until none is left; return how many jobs ran.

    Retries waiting out their backoff are made due at once, so a test sees
    each run's final state (succeeded, stuck, or waiting for something else)
    without sleeping. ``backend``: as for ``drain()`` (whose namespace).
    """
    total = 0
    for _ in range(max_rounds):
        ran = drain(concurrency=concurrency, include_retries=False, backend=backend)
        total += ran
        if not wf_store.step_jobs_retry_now(task_path=RUN_STEP_PATH) and not ran:
            break
    return total
