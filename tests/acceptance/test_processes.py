"""Real ``rundispatch`` processes, real signals, counted side effects."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from django_dispatch import enqueue_many, store
from django_dispatch.compat import TaskResultStatus
from django_dispatch.models import Job, Worker
from django_dispatch.runtime.listener import Listener, listener_params
from django_dispatch.states import JobState
from tests.concurrency import run_concurrently
from tests.conftest import ON_POSTGRES, ROOT, postgres_only, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution, SideEffect

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _states() -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in Job.objects.values_list("state", flat=True):
        counts[state] = counts.get(state, 0) + 1
    return counts


def test_two_processes_four_threads_run_each_job_exactly_once(start_worker):
    total = 2000 if ON_POSTGRES else 400
    enqueue_many(tasks.record, [((f"job-{i}",), {}) for i in range(total)])
    workers = [start_worker("--burst", "--concurrency", "4") for _ in range(2)]
    for worker in workers:
        assert worker.wait(180) == 0, worker.output()
    # Execution.key is unique: a second run of any job would have failed it.
    assert Execution.objects.count() == total
    assert _states() == {JobState.SUCCEEDED: total}
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert Execution.objects.values("worker_pid").distinct().count() == 2


def test_sigkill_mid_job_is_reclaimed_and_runs_again(start_worker, tmp_path):
    release = tmp_path / "release"
    enqueued = tasks.wait_for_file.enqueue("crash", str(release))
    victim = start_worker("--concurrency", "1")
    wait_until(
        lambda: SideEffect.objects.filter(key="crash", note="start").exists(),
        what="the first attempt to start",
    )
    first = Job.objects.get(pk=enqueued.id)
    old_lease = store.Lease(job_id=first.pk, worker_id=first.worker_id, epoch=first.lease_epoch)
    victim.signal(signal.SIGKILL)
    victim.wait()

    survivor = start_worker("--concurrency", "1")
    wait_until(
        lambda: SideEffect.objects.filter(key="crash", note="start").count() == 2,
        what="the job to be reclaimed and started again",
    )
    # The killed worker's lease is fenced out: its late writes change nothing.
    assert not store.job_finish_if_leased(old_lease, "from the dead")
    assert not store.job_progress_if_leased(old_lease, 99, lease_seconds=30)
    release.touch()
    wait_until(lambda: tasks.wait_for_file.get_result(enqueued.id).is_finished)
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0

    result = tasks.wait_for_file.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "crash"
    assert result.attempts == 2 and len(set(result.worker_ids)) == 2
    assert [e.exception_class_path for e in result.errors] == [
        "django_dispatch.exceptions.WorkerLost"
    ]
    job = Job.objects.get(pk=enqueued.id)
    assert job.worker_lost_count == 1 and job.checkpoint is None
    starts = SideEffect.objects.filter(key="crash", note="start")
    assert starts.values("worker_pid").distinct().count() == 2
    assert SideEffect.objects.filter(key="crash", note="end").count() == 1


def test_sigterm_hands_back_long_jobs_without_spending_attempts(start_worker, tmp_path):
    release = tmp_path / "release"
    long_jobs = [tasks.wait_for_file.enqueue(f"long-{i}", str(release)) for i in range(3)]
    worker = start_worker("--concurrency", "2", "--shutdown-timeout", "0.5")
    wait_until(
        lambda: SideEffect.objects.filter(note="start").count() == 2, what="two jobs to start"
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    assert "handed back" in worker.output()
    for job in Job.objects.all():
        assert job.state == JobState.PENDING, worker.output()
        assert job.attempts == 0 and job.worker_ids == [] and job.errors == []
    assert not Worker.objects.exists()  # deregistered

    release.touch()
    again = start_worker("--burst", "--concurrency", "3")
    assert again.wait(60) == 0, again.output()
    for enqueued in long_jobs:
        result = tasks.wait_for_file.get_result(enqueued.id)
        assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1
    assert SideEffect.objects.filter(note="end").count() == 3  # each finished once


def test_sigterm_lets_short_jobs_finish(start_worker):
    jobs = [tasks.sleep_then_record.enqueue(f"short-{i}", 0.5) for i in range(2)]
    worker = start_worker("--concurrency", "2", "--shutdown-timeout", "20")
    wait_until(lambda: SideEffect.objects.filter(note="start").count() == 2)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    for enqueued in jobs:
        result = tasks.sleep_then_record.get_result(enqueued.id)
        assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1


def test_max_jobs_lets_a_long_running_job_finish(start_worker):
    enqueued = tasks.sleep_then_record.enqueue("long", 2)
    worker = start_worker("--max-jobs", "1", "--shutdown-timeout", "0.2")
    assert worker.wait(30) == 0, worker.output()
    result = tasks.sleep_then_record.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1


def test_a_repeated_sigterm_is_one_stop_request(start_worker):
    """systemd and Ctrl-C signal the whole group; the supervisor forwards it too."""
    jobs = [tasks.sleep_then_record.enqueue(f"twice-{i}", 1) for i in range(2)]
    worker = start_worker("--concurrency", "2", "--shutdown-timeout", "20")
    wait_until(lambda: SideEffect.objects.filter(note="start").count() == 2)
    worker.signal(signal.SIGTERM)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    for enqueued in jobs:
        result = tasks.sleep_then_record.get_result(enqueued.id)
        assert result.status == TaskResultStatus.SUCCESSFUL, worker.output()


def test_processes_flag_forks_workers_under_a_supervisor(start_worker):
    enqueue_many(tasks.record, [((f"p-{i}",), {}) for i in range(200)])
    supervisor = start_worker(
        "--processes", "2", "--concurrency", "2", "--burst", "--worker-id", "sup"
    )
    assert supervisor.wait(120) == 0, supervisor.output()
    assert Execution.objects.count() == 200
    assert _states() == {JobState.SUCCEEDED: 200}
    ids = {w for row in Job.objects.values_list("worker_ids", flat=True) for w in row}
    assert ids <= {"sup.0", "sup.1"}


def test_supervisor_restarts_a_killed_child_and_exits_nonzero(start_worker):
    supervisor = start_worker("--processes", "2", "--concurrency", "1", "--worker-id", "sup")
    wait_until(lambda: Worker.objects.filter(id__in=["sup.0", "sup.1"]).count() == 2)
    child_pid = Worker.objects.get(id="sup.0").pid
    os.kill(child_pid, signal.SIGKILL)
    wait_until(
        lambda: Worker.objects.filter(id="sup.0").exclude(pid=child_pid).exists(),
        what="the killed child to be restarted",
    )
    enqueued = tasks.add.enqueue(1, 2)
    wait_until(lambda: tasks.add.get_result(enqueued.id).is_finished)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(30) == 1  # a child died abnormally: not silent
    assert "exited abnormally" in supervisor.output()


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (an orphan's zombie is reaped by init, not us)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_children_of_a_killed_supervisor_finish_their_jobs_and_exit(start_worker):
    """A supervisor killed outright forwards no SIGTERM: each child notices it
    is orphaned and stops as if it had one (its running job finishes), rather
    than live on claiming jobs beside the workers that replace it."""
    supervisor = start_worker("--processes", "2", "--concurrency", "1", "--worker-id", "orph")
    wait_until(lambda: Worker.objects.filter(id__in=["orph.0", "orph.1"]).count() == 2)
    children = list(Worker.objects.filter(id__startswith="orph.").values_list("pid", flat=True))
    enqueued = tasks.sleep_then_record.enqueue("orphaned", 1.5)
    wait_until(lambda: SideEffect.objects.filter(key="orphaned", note="start").exists())
    supervisor.signal(signal.SIGKILL)
    supervisor.wait()
    for pid in children:
        wait_until(partial(_gone, pid), timeout=20, what=f"orphaned child {pid} to exit")
    result = tasks.sleep_then_record.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1
    assert SideEffect.objects.filter(key="orphaned", note="end").count() == 1
    assert not Worker.objects.filter(id__startswith="orph.").exists()  # deregistered
    later = tasks.add.enqueue(1, 2)
    time.sleep(1.5)  # no orphan left to claim it
    assert tasks.add.get_result(later.id).status == TaskResultStatus.READY


def test_cpu_bound_job_keeps_its_lease(start_worker):
    # Runs 4x the lease TTL (2 s) in pure Python; the heartbeat must keep up.
    enqueued = tasks.cpu_bound.enqueue(8)
    worker = start_worker("--concurrency", "1")
    second = start_worker("--concurrency", "1")  # would steal an expired lease
    wait_until(lambda: tasks.cpu_bound.get_result(enqueued.id).is_finished, timeout=40)
    for w in (worker, second):
        w.signal(signal.SIGTERM)
        w.wait()
    result = tasks.cpu_bound.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1
    assert SideEffect.objects.filter(key="cpu_bound").count() == 1


def test_worker_refuses_to_start_without_migrations(tmp_path):
    if ON_POSTGRES:
        name = "dispatch_unmigrated"
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")
            cursor.execute(f"CREATE DATABASE {name}")
    else:
        name = str(tmp_path / "empty.sqlite3")
    try:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DISPATCH_DB_NAME": name}
        proc = subprocess.run(
            [sys.executable, "-m", "django", "rundispatch", "--burst"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0
        assert "not applied" in proc.stderr and "migrate" in proc.stderr
    finally:
        if ON_POSTGRES:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS {name}")


def test_unknown_queue_flag_is_rejected():
    # Every queue the test project's tasks and workflow steps use, or the system
    # checks (E005, E006) would stop the command before its own argument check.
    restricted = {
        "default": {
            "BACKEND": "django_dispatch.backend.DispatchBackend",
            "QUEUES": ["default", "emails", "heavy"],
        }
    }
    with override_settings(TASKS=restricted), pytest.raises(CommandError, match="nope"):
        call_command("rundispatch", "--queues", "emails,nope", "--burst")


def test_invalid_dispatch_settings_are_rejected():
    with (
        override_settings(DISPATCH={"LEASE_SECONDS": 3, "HEARTBEAT_INTERVAL": 2}),
        pytest.raises(CommandError, match="HEARTBEAT_INTERVAL"),
    ):
        call_command("rundispatch", "--burst")


# --- PostgreSQL: connections and wake-ups --------------------------------------


def _backends(db_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'",  # not autovacuum
            [db_name],
        )
        return cursor.fetchone()[0]


@postgres_only
def test_connection_budget_over_ten_thousand_jobs(start_worker):
    """concurrency + 2 connections (threads, control loop, listener), no leak."""
    total, concurrency = 10_000, 4
    enqueue_many(tasks.add, [((i, i), {}) for i in range(total)])
    db_name = connection.settings_dict["NAME"]
    worker = start_worker("--burst", "--concurrency", str(concurrency))
    peak = 0
    while worker.popen.poll() is None:
        peak = max(peak, _backends(db_name))
        time.sleep(0.05)
    assert worker.popen.returncode == 0, worker.output()
    assert _states() == {JobState.SUCCEEDED: total}
    assert 1 <= peak <= concurrency + 2, peak


@postgres_only
def test_listen_wakes_an_idle_worker_long_before_the_poll(start_worker):
    worker = start_worker("--concurrency", "1", overrides={"POLL_INTERVAL": 60.0})
    wait_until(lambda: Worker.objects.exists())
    time.sleep(0.5)  # let the listener connect; the worker is now idle
    enqueued = tasks.add.enqueue(1, 1)
    wait_until(
        lambda: tasks.add.get_result(enqueued.id).is_finished,
        timeout=10,
        what="pickup through NOTIFY (polling would take 60 s)",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


@postgres_only
def test_listener_killed_by_the_server_listens_again(start_worker):
    worker = start_worker("--concurrency", "1", overrides={"POLL_INTERVAL": 60.0})
    db_name = connection.settings_dict["NAME"]

    def listener_pids():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND query LIKE 'LISTEN%%'",
                [db_name],
            )
            return [row[0] for row in cursor.fetchall()]

    (pid,) = wait_until(listener_pids, what="the listener to connect")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_until(lambda: [p for p in listener_pids() if p != pid], what="a new listener")
    enqueued = tasks.add.enqueue(1, 1)
    wait_until(lambda: tasks.add.get_result(enqueued.id).is_finished, timeout=10)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert "LISTEN connection lost" in worker.output()


@postgres_only
def test_a_stopped_listener_ends_at_once_while_nothing_arrives():
    """``stop`` wakes the listener's wait on its socket: a stopping worker
    (``--burst``'s end, SIGTERM) does not wait out a polling interval. With
    nothing to wake it but the stop, a listener checking its connection once
    a minute ends within the join's two seconds; and five stops in a row
    take well under the 1-1.25 s they took when the thread noticed a stop
    only between half-second waits. Notifications still arrive."""
    connection.ensure_connection()
    listeners = [
        Listener(listener_params(connection), threading.Event(), health_interval=60.0)
        for _ in range(5)
    ]
    for listener in listeners:
        listener.start()
    try:
        for listener in listeners:
            assert listener.connected.wait(10)
        time.sleep(0.2)  # past the wake-up each listener gives itself on connecting
        for listener in listeners:
            listener.wakeup.clear()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [store.notify_channel("")])
        for listener in listeners:
            assert listener.wakeup.wait(5)
        time.sleep(0.2)  # every listener back in its wait
        started = time.monotonic()
        for listener in listeners:
            listener.stop()
            listener.join(2)
            assert not listener.is_alive()
        assert time.monotonic() - started < 0.5
    finally:
        for listener in listeners:
            listener.stop()
        for listener in listeners:
            listener.join(5)


def test_concurrent_claimers_in_threads_never_share(transactional_db):
    """Many threads claiming at once in one process, each with its own connection."""
    enqueue_many(tasks.add, [((i, i), {}) for i in range(300)])

    def claimer(n: int) -> list[int]:
        claimed: list[int] = []
        while True:
            batch = store.jobs_claim(worker_id=f"t{n}", queues=(), limit=7, lease_seconds=30)
            if not batch:
                return claimed
            claimed += [c.id for c in batch]

    claimed = run_concurrently(*(partial(claimer, n) for n in range(6)))
    ids = [i for ids_of_one in claimed for i in ids_of_one]
    assert len(ids) == len(set(ids)) == 300


def _finished(task, result_id):
    return lambda: task.get_result(result_id).is_finished


def test_a_dead_leaders_jobs_are_reclaimed_as_soon_as_another_worker_takes_office(
    start_worker, tmp_path
):
    """The new leader reclaims on taking office, not at its next RECLAIM_INTERVAL
    (30 s here): the dead leader's jobs run again about a lease after its death."""
    release = tmp_path / "release"
    jobs = [tasks.wait_for_file.enqueue(f"led-{i}", str(release)) for i in range(2)]
    leader = start_worker("--worker-id", "leader", "--concurrency", "2")
    wait_until(lambda: store.leadership_holder() == ("leader", True), what="a leader")
    starts = SideEffect.objects.filter(key__startswith="led-", note="start")
    wait_until(lambda: starts.count() == 2, what="the leader to run both jobs")
    survivor = start_worker(
        "--worker-id", "survivor", "--concurrency", "2", overrides={"RECLAIM_INTERVAL": 30.0}
    )
    wait_until(lambda: Worker.objects.filter(id="survivor").exists(), what="a second worker")

    leader.signal(signal.SIGKILL)
    leader.wait()
    killed_at = time.monotonic()
    wait_until(lambda: starts.count() == 4, timeout=15, what="the dead leader's jobs to run again")
    # A lease (2 s) and an election (0.3 s), plus start-up and polling slack.
    assert time.monotonic() - killed_at < 8, survivor.output()
    survivor.wait_for_output("worker survivor took leadership")
    for enqueued in jobs:
        job = Job.objects.get(pk=enqueued.id)
        assert job.worker_id == "survivor" and job.worker_lost_count == 1
    release.touch()
    for enqueued in jobs:
        wait_until(_finished(tasks.wait_for_file, enqueued.id))
        result = tasks.wait_for_file.get_result(enqueued.id)
        assert result.status == TaskResultStatus.SUCCESSFUL
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(30) == 0, survivor.output()


def test_a_deleted_worker_row_comes_back_at_the_next_heartbeat(start_worker):
    worker = start_worker("--worker-id", "phoenix", "--concurrency", "3", "--queues", "default")
    rows = Worker.objects.filter(id="phoenix")
    # Past its start's second registration, which would put a row deleted
    # before it back silently: only the heartbeat is left to do it.
    worker.wait_for_output("worker phoenix started")
    assert rows.exists()
    rows.delete()  # as the leader's stale-worker sweep does after a long pause
    row = wait_until(rows.first, timeout=5, what="the row to come back")
    assert (row.pid, row.concurrency, row.queues) == (worker.pid, 3, ["default"])
    worker.wait_for_output("recreated it")
    seen = row.last_seen_at
    wait_until(lambda: rows.get().last_seen_at > seen, what="heartbeats to go on")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    assert not rows.exists()  # still deregistered on exit


@postgres_only  # a process frozen inside a SQLite write would block every other writer
def test_a_worker_paused_past_the_stale_window_registers_again(start_worker):
    sweeper = start_worker(
        "--worker-id", "sweeper", "--concurrency", "1", overrides={"WORKER_STALE_SECONDS": 1.5}
    )
    wait_until(lambda: store.leadership_holder() == ("sweeper", True), what="a leader")
    sleeper = start_worker("--worker-id", "sleeper", "--concurrency", "1")
    rows = Worker.objects.filter(id="sleeper")
    # Started, not only registered: the row is first written as the id is
    # taken, and a worker paused before its start-up's registration would
    # bring the row back through it, not through the heartbeat under test.
    wait_until(lambda: "worker sleeper started" in sleeper.output(), what="the second worker")
    assert rows.exists()
    sleeper.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: not rows.exists(), timeout=10, what="the leader to delete the row")
    finally:
        sleeper.signal(signal.SIGCONT)
    wait_until(rows.exists, timeout=5, what="the resumed worker's row to come back")
    assert rows.get().pid == sleeper.pid
    # Logged just after the row's INSERT: the row can be seen before the line is.
    wait_until(lambda: "recreated it" in sleeper.output(), timeout=5, what="the log line")
    for worker in (sleeper, sweeper):
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
