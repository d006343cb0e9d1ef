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

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
from django.db import connections

from django_dispatch import enqueue_many
from django_dispatch.conf import get_settings
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.runtime import flow_cache, metering
from django_dispatch.runtime.completer import BatchCompleter
from django_dispatch.runtime.executor import Outcome
from django_dispatch.runtime.options import WorkerOptions
from django_dispatch.runtime.producer import Producer
from django_dispatch.runtime.running import RunningJob
from django_dispatch.runtime.slots import Slots
from django_dispatch.runtime.worker import Worker
from django_dispatch.testing import drain
from tests.conftest import postgres_only
from tests.runtime.test_takeover import gone_pid, held_job, incarnation, start
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
    hung = drainer.is_alive()
    if hung:  # stop it: a worker left running would take later tests' jobs
        for worker in [o for o in gc.get_objects() if isinstance(o, Worker)]:
            worker.force_stop = True
            worker.request_stop("the test ended")
        drainer.join(30)
    assert not hung, "the drain hung after its connection was cut"
    assert cut, "the control connection was never cut: the test proved nothing"
    assert ran and ran[0] >= JOBS
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == JOBS
    keys = set(SideEffect.objects.values_list("key", flat=True))
    assert keys == {f"job-{i}" for i in range(JOBS)}


def _terminate(conn) -> None:
    """End ``conn``'s server session from another connection, as a restart would."""
    conn.ensure_connection()
    pid = conn.connection.info.backend_pid
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


@contextmanager
def cutting_once(matches: Callable[[str], bool]) -> Iterator[list[int]]:
    """Within the block, the control connection's session is ended just before
    the first statement ``matches`` accepts, which then meets the cut; yields
    the backend pids cut (one, or none when no statement matched)."""
    control = connections["default"]
    cut: list[int] = []

    def cutting(execute, sql, params, many, context):
        if not cut and matches(sql):
            cut.append(control.connection.info.backend_pid)
            _terminate(control)
        return execute(sql, params, many, context)

    with control.execute_wrapper(cutting):
        yield cut


def test_a_wave_whose_planning_read_fails_has_its_successes_write_their_own():
    """The wave's plan reads the flow state on the control connection before
    its statement: when that read is what meets the cut, the successes the
    wave took must still be written and give their slots back."""
    enqueue_many(tasks.noop, [((i,), {}) for i in range(3)])
    # A poll interval of a minute: the claim below stages, so the wave's plan
    # does not leave the statement to the staging claim; it reads the flow state.
    settings = replace(get_settings(), POLL_INTERVAL=60.0)
    claimed = flow_cache.jobs_claim(
        worker_id="w-plan", queues=(), limit=3, lease_seconds=30, db="default",
        namespace="", max_age=settings.POLL_INTERVAL,
    )  # fmt: skip
    assert len(claimed) == 3
    slots = Slots(8)  # free slots: the wave claims, so it plans its claim
    batch = BatchCompleter(threading.Event(), 30, slots=slots, db="default")
    batch.start()
    producer = Producer(
        WorkerOptions(worker_id="w-plan"), settings, db="default", slots=slots, batch=batch
    )
    try:
        for job in claimed:
            running = RunningJob(claimed=job, lease_seconds=30)
            slots.running[job.id] = running
            meter = metering.start(job.id, thread_cpu=True)
            meter.stop()
            assert batch.hand_over(running, Outcome("succeeded", job.id), meter)
        flow_cache.forget_paused()  # the next wave reads the flow state first
        _terminate(connections["default"])
        assert producer.guard(producer.cycle) is None  # the read met the cut
        deadline = time.monotonic() + 20
        while slots.running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not slots.running, "a success whose wave failed kept its slot"
    finally:
        batch.stop()
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == 3


@pytest.mark.parametrize(
    "statement",
    [("SELECT", '"django_dispatch_worker"'), ("UPDATE", '"started_at"')],
    ids=["take_id", "register"],
)
def test_a_connection_cut_as_the_worker_registers_is_ridden_out(statement, caplog):
    """The start's statements (taking the worker's id, then registering) are
    tried again after a database error, as the control loop's are: a
    connection cut right then (a failover, a pooler's restart) does not end
    the worker, or a drain, with the error."""
    tasks.record.enqueue("after-the-cut")
    verb, mark = statement

    def registering(sql: str) -> bool:
        return sql.startswith(verb) and '"django_dispatch_worker"' in sql and mark in sql

    with cutting_once(registering) as cut:
        ran = drain()
    assert cut, "the registration was never cut: the test proved nothing"
    assert "as the worker starts; will retry" in caplog.text
    assert ran == 1
    assert Job.objects.get().state == JobState.SUCCEEDED


def test_a_cut_while_taking_back_a_dead_incarnations_jobs_still_takes_them_all():
    """The id is taken, then the cut lands on the take-back's first statement:
    the retry takes back from the incarnation the id was taken from (a retry of
    the whole start would find the id already this process's, and take back
    nothing, leaving the jobs to their leases' expiry)."""
    incarnation("cut-back", pid=gone_pid())
    held = [held_job("cut-back"), held_job("cut-back")]
    with cutting_once(lambda sql: '"django_dispatch_job"' in sql) as cut:
        taken = start("cut-back")
    assert cut, "the take-back was never cut: the test proved nothing"
    assert taken == 2
    for job in held:
        row = Job.objects.get(pk=job.pk)
        assert (row.state, row.worker_lost_count) == (JobState.PENDING, 1)


def test_a_cut_after_the_workers_last_round_does_not_end_the_drain_with_the_error(caplog):
    """Between its worker's rounds, ``drain`` makes waiting retries due on the
    control connection: a cut that lands there (the worker's own statements
    all rode it out) is ridden out too, and the drain returns every job it ran."""
    tasks.record.enqueue("before-the-cut")

    def making_retries_due(sql: str) -> bool:
        return sql.startswith('UPDATE "django_dispatch_job" SET "run_after"') and (
            '"attempts" >' in sql
        )

    with cutting_once(making_retries_due) as cut:
        ran = drain()
    assert cut, "the retries' statement was never cut: the test proved nothing"
    assert "between drain()'s rounds; will retry" in caplog.text
    assert ran == 1
    assert Job.objects.get().state == JobState.SUCCEEDED
