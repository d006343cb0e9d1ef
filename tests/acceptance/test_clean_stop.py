"""A clean stop does not look like a crash: the leader steps down and says so."""

from __future__ import annotations

import io
import signal

import pytest
from django.core.management import call_command

from django_dispatch.models import Leadership
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _status() -> str:
    out = io.StringIO()
    call_command("dispatch_status", stdout=out)
    return out.getvalue()


def test_a_leader_stopped_cleanly_steps_down_and_a_killed_one_leaves_an_expired_lease(
    start_worker,
):
    first = start_worker("--concurrency", "1", "--worker-id", "clean-leader")
    wait_until(lambda: Leadership.objects.filter(holder="clean-leader").exists(), what="leads")
    assert "Leader: clean-leader\n" in _status()
    first.signal(signal.SIGTERM)
    assert first.wait() == 0, first.output()
    assert not Leadership.objects.exists()
    assert "Leader: none (none elected yet, or the last one stopped cleanly)" in _status()
    assert "clean-leader stepped down as leader (clean stop)" in first.output()

    second = start_worker("--concurrency", "1", "--worker-id", "killed-leader")  # 2 s leases
    wait_until(lambda: Leadership.objects.filter(holder="killed-leader").exists(), what="leads")
    second.signal(signal.SIGKILL)
    second.wait()
    wait_until(lambda: "(lease expired" in _status(), timeout=10, what="the lease expires")
    assert "Leader: killed-leader (lease expired: it stopped renewing" in _status()
