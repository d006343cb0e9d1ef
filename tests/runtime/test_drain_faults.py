"""A worker's control loop survives its own connection being cut mid-drain.

``testing.drain`` runs the real worker in-process: its control loop (claims,
completion waves, duties) uses the calling thread's connection. Cutting that
connection with ``pg_terminate_backend`` (what a server restart or a pooler
dropping the socket does) makes whichever statement is next fail: often a
completion wave, whose jobs then write their own outcomes. Every job must
still end succeeded, and the drain must end: a job whose wave failed must not
keep its slot (and its lease renewed) after its own write.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from django_dispatch import enqueue_many
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.testing import drain
from tests.conftest import postgres_only
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = [postgres_only, pytest.mark.django_db(transaction=True)]

JOBS = 400
CUTS = 8


def _cut_repeatedly(control, stop: threading.Event, cut: list[int]) -> None:
    """Terminate the control loop's backend every 50 ms, ``CUTS`` times."""
    other = connections.create_connection("default")
    try:
        while len(cut) < CUTS and not stop.wait(0.05):
            raw = control.connection
            pid = getattr(getattr(raw, "info", None), "backend_pid", None)
            if pid is None or (cut and cut[-1] == pid):
                continue  # not reconnected yet
            with other.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            cut.append(pid)
    finally:
        other.close()


def test_a_drain_whose_control_connection_is_cut_again_and_again_ends_with_every_job():
    enqueue_many(tasks.record_many, [((f"job-{i}",), {}) for i in range(JOBS)])
    stop, cut, ran = threading.Event(), [], []
    control: list = []

    def run() -> None:
        # The control loop runs on this thread, with this thread's connection.
        control.append(connections["default"])
        control[0].ensure_connection()
        try:
            ran.append(drain(concurrency=4))
        finally:
            connections.close_all()

    drainer = threading.Thread(target=run, daemon=True)  # daemon: a hang fails, not blocks
    drainer.start()
    while not control:
        time.sleep(0.001)
    killer = threading.Thread(target=_cut_repeatedly, args=(control[0], stop, cut))
    killer.start()
    drainer.join(60)
    stop.set()
    killer.join()
    assert not drainer.is_alive(), "the drain hung after its connection was cut"
    assert cut, "the control connection was never cut: the test proved nothing"
    assert ran and ran[0] >= JOBS
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == JOBS
    keys = set(SideEffect.objects.values_list("key", flat=True))
    assert keys == {f"job-{i}" for i in range(JOBS)}
