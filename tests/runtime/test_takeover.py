"""``rundispatch --worker-id ID``: a worker restarted under the id of a dead incarnation
takes that incarnation's running jobs back at once; a live one keeps its id.

The rules are checked in-process on rows written the way a worker writes them
(``take_id``), and end to end with real ``rundispatch`` processes: SIGKILL one
with a lease of 60 s, restart it under its id, and the job is back within seconds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from django_dispatch import store
from django_dispatch.conf import get_settings
from django_dispatch.models import Job, JobUsage, Worker
from django_dispatch.runtime import takeover
from django_dispatch.runtime.options import WorkerOptions
from django_dispatch.runtime.takeover import WorkerIdInUse, registration, take_id
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from tests.conftest import wait_until
from tests.testapp import flow_tasks, tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

HOST = socket.gethostname()
#: A lease long enough that only the takeover, never the lease's expiry, can
#: return the job within the test's time.
LONG_LEASE = {"LEASE_SECONDS": 60.0, "HEARTBEAT_INTERVAL": 0.3}
#: Heartbeats far enough apart (stale after 6 s) that a live worker slowed down
#: by a busy test machine is never judged dead by its heartbeat.
SLOW_BEATS = {"LEASE_SECONDS": 60.0, "HEARTBEAT_INTERVAL": 2.0}


def gone_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def incarnation(worker_id: str, *, hostname: str = HOST, pid: int, seen_ago: float = 0.0) -> None:
    """The row a worker under ``worker_id`` left, last seen ``seen_ago`` s ago."""
    Worker.objects.create(id=worker_id, hostname=hostname, pid=pid, queues=[], concurrency=1)
    if seen_ago:
        Worker.objects.filter(id=worker_id).update(
            last_seen_at=timezone.now() - timedelta(seconds=seen_ago)
        )


def held_job(worker_id: str) -> Job:
    """A job running under ``worker_id``'s lease (60 s: far from expiring)."""
    result = flow_tasks.mark.enqueue(f"held-{worker_id}")
    [claimed] = store.jobs_claim(worker_id=worker_id, queues=(), limit=1, lease_seconds=60)
    assert claimed.id == int(result.id)
    return Job.objects.get(pk=claimed.id)


def start(worker_id: str) -> int:
    options = WorkerOptions(worker_id=worker_id)
    return take_id(options, registration(options, store.db_alias()), get_settings())


def test_a_dead_incarnation_on_this_host_loses_its_jobs_to_the_restart_at_once():
    incarnation("stable", pid=gone_pid())
    before = held_job("stable")
    other = held_job("someone-else")
    assert start("stable") == 1
    job = Job.objects.get(pk=before.pk)
    # recorded exactly as a reclaim records a lost worker
    assert (job.state, job.worker_id, job.lease_expires_at) == (JobState.PENDING, None, None)
    assert job.lease_epoch == before.lease_epoch + 1 and job.worker_lost_count == 1
    assert job.attempts == 1  # a lost worker's attempt is not counted against max_attempts
    error = job.errors[-1]
    assert error["exception_class_path"] == "django_dispatch.exceptions.WorkerLost"
    assert "restarted under its id" in error["message"]
    usage = JobUsage.objects.get(job_id=job.pk)
    assert (usage.outcome, usage.worker_id, usage.attempt) == ("worker_lost", "stable", 1)
    # only that id's jobs; the id is now this process's
    assert Job.objects.get(pk=other.pk).state == JobState.RUNNING
    row = Worker.objects.get(id="stable")
    assert (row.hostname, row.pid) == (HOST, os.getpid())


def test_an_incarnation_with_a_stale_heartbeat_on_another_host_is_dead():
    stale = 3 * get_settings().HEARTBEAT_INTERVAL + 1
    incarnation("pod-0", hostname="elsewhere", pid=1, seen_ago=stale)
    job = held_job("pod-0")
    assert start("pod-0") == 1
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING


@pytest.mark.parametrize(
    ("hostname", "alive"),
    [(HOST, True), ("elsewhere", False)],  # elsewhere: its pid cannot be checked
)
def test_a_live_incarnation_keeps_its_id_and_its_jobs(hostname, alive):
    pid = os.getppid() if alive else gone_pid()
    incarnation("taken", hostname=hostname, pid=pid)
    job = held_job("taken")
    with pytest.raises(WorkerIdInUse, match=f"'taken' is in use.*pid {pid} on host {hostname}"):
        start("taken")
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert Job.objects.get(pk=job.pk).lease_epoch == job.lease_epoch
    assert Worker.objects.get(id="taken").pid == pid  # its row untouched


def test_no_row_or_this_process_own_row_takes_nothing():
    job = held_job("fresh")  # a job under an id nobody registered (no live row to judge)
    assert start("fresh") == 0
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert Worker.objects.get(id="fresh").pid == os.getpid()
    assert start("fresh") == 0  # its own row (this process): neither refused nor rescued
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_a_container_restarted_as_the_same_pid_takes_its_predecessors_jobs():
    """A pod restarted under its hostname runs rundispatch as the same pid (often 1):
    a row with this host and pid that this process did not register is a dead one's."""
    incarnation("pod-1", pid=os.getpid())
    job = held_job("pod-1")
    assert start("pod-1") == 1
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING
    assert start("pod-1") == 0  # now it is this process's own row


def test_a_pid_now_held_by_a_younger_process_is_a_dead_incarnation():
    """--processes children in a restarted container: the old child's pid may be some
    live process of the new container, started after the row was registered."""
    younger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        incarnation("sup.0", pid=younger.pid)
        Worker.objects.filter(id="sup.0").update(started_at=timezone.now() - timedelta(seconds=60))
        job = held_job("sup.0")
        assert start("sup.0") == 1
        assert Job.objects.get(pk=job.pk).state == JobState.PENDING
    finally:
        younger.kill()
        younger.wait()


def _job_started(key: str) -> list[int]:
    return list(
        SideEffect.objects.filter(key=key, note="start").values_list("worker_pid", flat=True)
    )


@pytest.mark.slow
def test_a_worker_restarted_under_its_id_takes_its_job_back_within_seconds(
    start_worker, tmp_path: Path
):
    go = tmp_path / "go"
    first = start_worker("--worker-id", "stable", overrides=LONG_LEASE)
    result = tasks.wait_for_file.enqueue("restart", str(go), 120)
    wait_until(lambda: _job_started("restart"), timeout=60, what="the first worker to start it")
    held = Job.objects.get(pk=int(result.id))
    assert (held.state, held.worker_id) == (JobState.RUNNING, "stable")
    first.signal(signal.SIGKILL)
    first.wait()
    restarted_at = time.monotonic()
    second = start_worker("--worker-id", "stable", overrides=LONG_LEASE)
    wait_until(
        lambda: Job.objects.filter(pk=held.pk, lease_epoch__gt=held.lease_epoch).exists(),
        timeout=30,
        what="the restarted worker to take the job back",
    )
    # far sooner than the 60 s lease: the process start, then one transaction
    assert time.monotonic() - restarted_at < 20
    wait_until(
        lambda: second.pid in _job_started("restart"), timeout=30, what="the job to run again"
    )
    go.touch()
    wait_until(
        lambda: Job.objects.get(pk=held.pk).state == JobState.SUCCEEDED,
        timeout=30,
        what="the job to finish",
    )
    job = Job.objects.get(pk=held.pk)
    assert (job.attempts, job.worker_lost_count) == (2, 1)
    assert "restarted under its id" in job.errors[-1]["message"]
    outcomes = JobUsage.objects.filter(job_id=job.pk).order_by("attempt")
    assert [(u.attempt, u.outcome) for u in outcomes] == [(1, "worker_lost"), (2, "succeeded")]
    assert _job_started("restart") == [first.pid, second.pid]
    second.wait_for_output("took back 1 running jobs")
    second.signal(signal.SIGTERM)
    assert second.wait() == 0


@pytest.mark.slow
def test_a_second_worker_under_a_live_worker_id_refuses_to_start(start_worker):
    first = start_worker("--worker-id", "dup", overrides=SLOW_BEATS)
    wait_until(lambda: Worker.objects.filter(id="dup").exists(), timeout=60, what="the first")
    second = start_worker("--worker-id", "dup", overrides=SLOW_BEATS)
    assert second.wait(60) == 1
    output = second.output()
    assert "--worker-id 'dup' is in use" in output and f"pid {first.pid}" in output
    assert "Traceback" not in output
    # the first one still holds its id, and works
    assert Worker.objects.get(id="dup").pid == first.pid
    result = flow_tasks.mark.enqueue("still-working")
    wait_until(
        lambda: Job.objects.get(pk=int(result.id)).state == JobState.SUCCEEDED,
        timeout=30,
        what="the first worker to run a job",
    )
    assert first.popen.poll() is None
    first.signal(signal.SIGTERM)
    assert first.wait() == 0


@pytest.mark.slow
def test_a_supervised_child_restarted_after_a_crash_takes_its_jobs_back(
    start_worker, tmp_path: Path
):
    """A ``--processes`` child keeps its id (``ID.index``) across the supervisor's
    restart, so the restarted child takes back what the crashed one held."""
    go = tmp_path / "go"
    supervisor = start_worker("--processes", "2", "--worker-id", "pool", overrides=LONG_LEASE)
    result = tasks.wait_for_file.enqueue("child", str(go), 120)
    wait_until(lambda: _job_started("child"), timeout=60, what="a child to start the job")
    held = Job.objects.get(pk=int(result.id))
    assert held.worker_id in ("pool.0", "pool.1")
    crashed = Worker.objects.get(id=held.worker_id).pid
    os.kill(crashed, signal.SIGKILL)  # the supervisor reaps it and starts another
    wait_until(
        lambda: Job.objects.filter(pk=held.pk, lease_epoch__gt=held.lease_epoch).exists(),
        timeout=30,
        what="the restarted child to take the job back",
    )
    go.touch()
    wait_until(
        lambda: Job.objects.get(pk=held.pk).state == JobState.SUCCEEDED,
        timeout=30,
        what="the job to finish",
    )
    job = Job.objects.get(pk=held.pk)
    assert (job.attempts, job.worker_lost_count) == (2, 1)
    assert "restarted under its id" in job.errors[-1]["message"]
    assert crashed not in Worker.objects.values_list("pid", flat=True)
    supervisor.signal(signal.SIGTERM)
    supervisor.wait()


def test_an_incarnation_whose_id_was_taken_over_stops_and_leaves_the_new_row(start_worker):
    """A worker judged dead by its heartbeat (frozen) but alive after all finds, at its
    next heartbeat, that another process holds its id: it stops rather than run on
    as a second process of one id, and its stop does not delete the new owner's row."""
    worker = start_worker("--concurrency", "1", "--worker-id", "woken", overrides=LONG_LEASE)
    wait_until(lambda: Worker.objects.filter(id="woken").exists(), what="registered")
    Worker.objects.filter(id="woken").update(hostname="new-host", pid=4242)  # taken over
    assert worker.wait(timeout=30) == 0, worker.output()
    assert "its id was taken over by pid 4242 on host new-host" in worker.output()
    row = Worker.objects.get(id="woken")
    assert (row.hostname, row.pid) == ("new-host", 4242)


def test_a_takeover_between_taking_the_id_and_starting_stops_the_worker_at_once(monkeypatch):
    """Taken over right after ``take_id`` (this process judged dead meanwhile): the
    start's refresh of the row must not write this process back over the new
    owner's, and the worker stops before it claims anything."""
    real = takeover.take_id

    def take_then_lose_it(options, registration, settings):
        taken = real(options, registration, settings)
        Worker.objects.filter(id=options.worker_id).update(hostname="new-host", pid=4242)
        return taken

    monkeypatch.setattr(takeover, "take_id", take_then_lose_it)
    enqueued = tasks.noop.enqueue()
    assert drain(worker_id="woken") == 0
    row = Worker.objects.get(id="woken")
    assert (row.hostname, row.pid) == ("new-host", 4242)
    assert Job.objects.get(pk=enqueued.id).state == JobState.PENDING
