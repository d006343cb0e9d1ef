"""Timeouts and cancels that task code ignores: the worker process recycles
itself (re-executes, same PID) to end the code, and the job's retry or the
next job of its partition starts only after that code is dead.

Real worker processes, real signals. A "zombie" task writes a numbered row
every 10 ms until it is killed; row ids (assigned at insert) order its side
effects against those of the jobs that must not overlap it.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from django_dispatch import cancel
from django_dispatch.compat import TaskResultStatus
from django_dispatch.models import Job
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from tests.conftest import ROOT, wait_until
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

# A short grace; a lease long enough for the re-executed process to settle
# what its predecessor left (Django's start-up) before it could expire.
OVERRIDES = {"TIMEOUT_GRACE": 0.5, "LEASE_SECONDS": 10.0}
TIMEOUT = "django_dispatch.exceptions.TaskTimeout"


def _zombie_rows(key: str):
    return SideEffect.objects.filter(key=key, note__startswith="zombie")


def _succeeded(task, result_id):
    return lambda: task.get_result(result_id).status == TaskResultStatus.SUCCESSFUL


def _serves_another_job(key: str) -> None:
    """A job enqueued now runs: the worker is alive and claiming after the recycle."""
    enqueued = tasks.record_many.enqueue(key)
    wait_until(_succeeded(tasks.record_many, enqueued.id), what=f"{key} to run")


def _parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("PPid:")).split()[1])


@pytest.mark.slow
def test_a_task_over_its_timeout_is_killed_and_its_retry_never_overlaps_it(start_worker, tmp_path):
    zombie = tasks.ignores_timeout.using(partition_key="acct:1").enqueue("zombie")
    after = tasks.record_many.using(partition_key="acct:1").enqueue("after-zombie")
    release = tmp_path / "release"
    sibling = tasks.wait_for_file.enqueue("sibling", str(release))
    # The sibling gets the shutdown timeout to finish before the recycle; it
    # does not (the file appears later), so it is handed back.
    worker = start_worker("--concurrency", "3", "--shutdown-timeout", "1", overrides=OVERRIDES)

    wait_until(_succeeded(tasks.ignores_timeout, zombie.id), what="the retry to succeed")
    wait_until(_succeeded(tasks.record_many, after.id), what="the next job of the partition")
    log = worker.output()
    assert "recycling the worker process" in log, log

    # The attempt is recorded as a timeout; the retry ran once, afterwards.
    result = tasks.ignores_timeout.get_result(zombie.id)
    assert result.attempts == 2 and result.return_value == 2
    assert [e.exception_class_path for e in result.errors] == [TIMEOUT]
    assert "recycled" in Job.objects.get(pk=zombie.id).errors[0]["message"]
    (retry_row,) = SideEffect.objects.filter(key="zombie", note="attempt 2")
    zombie_rows = _zombie_rows("zombie")
    last_zombie = zombie_rows.order_by("-id").first()
    assert zombie_rows.count() > 3
    (after_row,) = SideEffect.objects.filter(key="after-zombie")
    assert last_zombie.id < retry_row.id < after_row.id
    assert last_zombie.started_at < retry_row.started_at

    # Same PID: the process re-executed itself rather than being replaced.
    assert worker.popen.poll() is None
    assert {r.worker_pid for r in SideEffect.objects.filter(key="zombie")} == {worker.pid}

    # The zombie is dead: a full round trip later it has written nothing more.
    written = zombie_rows.count()
    _serves_another_job("after-recycle")
    assert zombie_rows.count() == written

    # The job running beside it was handed back, without spending an attempt,
    # and run again by the re-executed process.
    release.touch()
    wait_until(_succeeded(tasks.wait_for_file, sibling.id), what="the sibling to finish")
    assert tasks.wait_for_file.get_result(sibling.id).attempts == 1
    assert SideEffect.objects.filter(key="sibling", note="start").count() == 2
    assert SideEffect.objects.filter(key="sibling", note="end").count() == 1

    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


@pytest.mark.slow
def test_jobs_beside_a_stuck_one_finish_before_the_recycle(start_worker, tmp_path):
    """A recycle must not cost the other jobs their work: they finish first."""
    zombie = tasks.ignores_timeout.enqueue("zombie-beside")
    release = tmp_path / "release"
    sibling = tasks.wait_for_file.enqueue("beside", str(release))
    worker = start_worker("--concurrency", "2", overrides=OVERRIDES)
    wait_until(lambda: "after it was asked to stop (timed out)" in worker.output(), timeout=30)
    release.touch()  # the sibling finishes while the recycle waits for it

    wait_until(_succeeded(tasks.ignores_timeout, zombie.id), what="the retry to succeed")
    assert tasks.wait_for_file.get_result(sibling.id).status == TaskResultStatus.SUCCESSFUL
    assert tasks.wait_for_file.get_result(sibling.id).attempts == 1
    assert SideEffect.objects.filter(key="beside", note="start").count() == 1
    (end,) = SideEffect.objects.filter(key="beside", note="end")
    (retry_row,) = SideEffect.objects.filter(key="zombie-beside", note="attempt 2")
    assert end.id < retry_row.id  # finished before the process was recycled
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


@pytest.mark.slow
def test_a_cancelled_task_that_ignores_the_cancel_is_killed(start_worker):
    deaf = tasks.ignores_cancel.using(partition_key="acct:2").enqueue("deaf")
    after = tasks.record_many.using(partition_key="acct:2").enqueue("after-deaf")
    worker = start_worker("--concurrency", "2", overrides=OVERRIDES)
    wait_until(lambda: _zombie_rows("deaf").count() >= 5, what="the task to run")
    assert cancel(deaf.id)

    wait_until(_succeeded(tasks.record_many, after.id), what="the next job of the partition")
    worker.wait_for_output("recycling the worker process")
    job = Job.objects.get(pk=deaf.id)
    assert job.state == JobState.CANCELLED and job.lease_expires_at is None
    assert job.attempts == 1 and job.errors == []
    (after_row,) = SideEffect.objects.filter(key="after-deaf")
    assert _zombie_rows("deaf").order_by("-id").first().id < after_row.id

    assert worker.popen.poll() is None
    written = _zombie_rows("deaf").count()
    _serves_another_job("after-cancel")
    assert _zombie_rows("deaf").count() == written
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.01, 0.03, 0.1, 0.3, 0.6])
def test_a_stop_signal_during_a_recycle_is_not_lost(start_worker, delay):
    """SIGTERM as the worker decides to recycle, while it hands over, or while its
    successor starts (``delay`` after the decision is logged): held across execve, the
    successor settles the handover, then stops."""
    zombie = tasks.ignores_timeout.enqueue("zombie-stop")
    worker = start_worker("--concurrency", "2", overrides=OVERRIDES)
    wait_until(lambda: "after it was asked to stop (timed out)" in worker.output(), timeout=30)
    time.sleep(delay)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    log = worker.output()
    assert "recycling the worker process" in log, log
    job = Job.objects.get(pk=zombie.id)
    # Settled by the successor (not left to expire as a lost worker). The retry
    # backs off; with the latest signals its backoff may end before the signal
    # comes, and then the successor runs it, once, before it stops.
    assert [e["exception_class_path"] for e in job.errors] == [TIMEOUT], log
    assert job.worker_lost_count == 0, log
    retried = SideEffect.objects.filter(key="zombie-stop", note="attempt 2").count()
    assert (job.state, job.attempts, retried) in (
        (JobState.SCHEDULED, 1, 0),
        (JobState.SUCCEEDED, 2, 1),
    ), log


@pytest.mark.slow
@pytest.mark.parametrize("run", range(5))
def test_a_stop_signal_a_job_thread_takes_during_a_recycle_is_not_lost(start_worker, tmp_path, run):
    """The zombie sends SIGTERM to its own thread once the main thread re-executes the
    process (past reading whether a stop was asked): a signal the main thread's mask cannot
    hold, whose Python handler runs too late to be read. The successor still stops. A run
    whose zombie ``execve`` ended first has nothing to stop for."""
    marker = tmp_path / "signalled"
    marker.write_bytes(b"\0")  # the zombie sets it to 1 right after its signal

    def signalled() -> bool:
        return marker.read_bytes() == b"\1"

    zombie = tasks.signals_its_own_thread.enqueue("thread-stop", str(marker))
    worker = start_worker("--concurrency", "2", overrides=OVERRIDES)
    wait_until(lambda: worker.output().count(" started: queues=") == 2, what="the successor")
    if not signalled():  # execve ended the zombie before it sent it
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
        pytest.skip("execve ended the zombie before it could signal: nothing was tested")
    assert worker.wait(30) == 0, worker.output()
    log = worker.output()
    job = Job.objects.get(pk=zombie.id)
    assert [e["exception_class_path"] for e in job.errors] == [TIMEOUT], log
    assert job.state == JobState.SCHEDULED and job.worker_lost_count == 0  # backing off
    assert not SideEffect.objects.filter(key="thread-stop", note="attempt 2").exists()


@pytest.mark.slow
def test_a_child_of_the_supervisor_recycles_in_place(start_worker):
    zombie = tasks.ignores_timeout.enqueue("child-zombie")
    supervisor = start_worker("--processes", "2", "--concurrency", "1", overrides=OVERRIDES)
    wait_until(_succeeded(tasks.ignores_timeout, zombie.id), what="the retry to succeed")
    supervisor.wait_for_output("recycling the worker process")
    result = tasks.ignores_timeout.get_result(zombie.id)
    assert [e.exception_class_path for e in result.errors] == [TIMEOUT]

    # The recycled child is still the supervisor's child, and still serving.
    (child_pid,) = {r.worker_pid for r in _zombie_rows("child-zombie")}
    assert _parent_of(child_pid) == supervisor.pid
    written = _zombie_rows("child-zombie").count()
    for i in range(4):
        _serves_another_job(f"child-after-{i}")
    assert _zombie_rows("child-zombie").count() == written

    supervisor.signal(signal.SIGTERM)  # a recycle is not an abnormal exit
    assert supervisor.wait(30) == 0, supervisor.output()


def test_a_task_that_stops_when_asked_records_its_timeout():
    """In-process (no recycling needed): the lease is held until the code returns."""
    enqueued = tasks.stops_when_asked.enqueue("polite")
    drain()
    job = Job.objects.get(pk=enqueued.id)
    assert job.state == JobState.FAILED
    assert [e["exception_class_path"] for e in job.errors] == [TIMEOUT]
    assert "asked to stop, and did" in job.errors[0]["message"]
    assert SideEffect.objects.filter(key="polite", note="stopped").count() == 1


@pytest.mark.slow
def test_an_async_task_that_blocks_its_event_loop_is_killed_too(start_worker, tmp_path):
    lines = tmp_path / "lines"
    enqueued = tasks.async_blocks_its_loop.enqueue(str(lines))
    worker = start_worker("--concurrency", "1", overrides=OVERRIDES)
    wait_until(_succeeded(tasks.async_blocks_its_loop, enqueued.id), what="the retry")
    result = tasks.async_blocks_its_loop.get_result(enqueued.id)
    assert [e.exception_class_path for e in result.errors] == [TIMEOUT]
    worker.wait_for_output("recycling the worker process")
    written = lines.read_text().splitlines()
    # Every line of the zombie precedes the retry's, all from the same PID.
    assert written[-1].startswith("attempt 2") and len(written) > 3
    assert all(line.startswith("zombie") for line in written[:-1])
    assert {line.split()[-1] for line in written} == {str(worker.pid)}
    _serves_another_job("after-async")
    assert lines.read_text().splitlines() == written
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


def _probe(*args: str, overrides: dict | None = None, **env: str) -> subprocess.CompletedProcess:
    """Run ``tests/recycle_probe.py`` on the test database; its output is in stdout."""
    connection.ensure_connection()
    return subprocess.run(
        [sys.executable, "-m", "tests.recycle_probe", *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DISPATCH_DB_NAME": str(connection.settings_dict["NAME"]),
            "DISPATCH_OVERRIDES": json.dumps(overrides or {}),
            "PYTHONUNBUFFERED": "1",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=90,
    )


@pytest.mark.slow
def test_a_handover_past_the_environment_limit_reaches_the_successor(tmp_path):
    """Thousands of entries with long partition keys: more than one environment
    variable may hold (128 KiB on Linux), passed on through a real execve."""
    scratch = tmp_path / "tmp"  # the successor's temporary directory
    scratch.mkdir()
    probe = _probe("handover", str(tmp_path), "1000", TMPDIR=str(scratch))
    assert probe.returncode == 0, probe.stdout
    assert "recycling the worker process" in probe.stdout
    sent = json.loads((tmp_path / "sent.json").read_text())
    received = json.loads((tmp_path / "received.json").read_text())
    assert len(sent["handover"]) > 128 * 1024
    assert sent["fits_in_env"] is False  # in one variable, execve fails with E2BIG
    assert received["pid"] == sent["pid"]  # the same process, re-executed
    assert received["handover"] == sent["handover"], probe.stdout
    # Read once: gone from the environment, the descriptor closed, nothing on disk.
    assert not received["env_left"] and not received["fd_still_open"]
    assert list(scratch.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["call-command", "management-utility"])
def test_a_script_whose_command_line_mentions_rundispatch_does_not_recycle(mode):
    """Recycling re-executes the process's own command line, which is only
    right when that command line started ``rundispatch`` (``pytest -k
    rundispatch`` is not one): the script gives the stuck thread up instead."""
    zombie = tasks.ignores_timeout.enqueue(f"script-{mode}")
    probe = _probe(mode, "-k", "rundispatch", overrides=OVERRIDES)
    assert probe.returncode == 0, probe.stdout
    assert "recycling the worker process" not in probe.stdout
    # The timeout is recorded by the script's own worker (its retry waits for
    # its backoff, after the burst ended), not by a re-executed successor.
    job = Job.objects.get(pk=zombie.id)
    assert job.state == JobState.SCHEDULED and job.attempts == 1, probe.stdout
    assert [e["exception_class_path"] for e in job.errors] == [TIMEOUT]
    assert "given up on" in job.errors[0]["message"]
