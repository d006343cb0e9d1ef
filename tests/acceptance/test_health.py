"""``manage.py dispatch_health``: a probe that is right about a real worker.

Healthy with a worker heartbeating; unhealthy with none, with one frozen by
SIGSTOP (its heartbeat stops, its process does not), and when the database
does not answer; a dead worker's leftover row does not fail the probe.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from django_dispatch.models import Worker
from tests.conftest import ON_POSTGRES, ROOT, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def health(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("dispatch_health", *args, stdout=out)
    except CommandError as e:
        return e.returncode, str(e)
    return 0, out.getvalue()


def registered(worker_id: str) -> bool:
    return Worker.objects.filter(id=worker_id).exists()


@pytest.mark.slow
def test_healthy_while_a_worker_heartbeats_unhealthy_once_it_is_frozen(start_worker):
    worker = start_worker("--worker-id", "probe-me")
    wait_until(lambda: registered("probe-me"), timeout=30)
    code, text = health("--max-age", "1")
    assert code == 0 and "healthy: 1 worker(s)" in text, text
    worker.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: health("--max-age", "1")[0] != 0, timeout=10, what="unhealthy")
        code, text = health("--max-age", "1")
        assert code == 1
        assert "probe-me" in text and "stopped heartbeating" in text
    finally:
        worker.signal(signal.SIGCONT)
    wait_until(lambda: health("--max-age", "1")[0] == 0, timeout=10, what="healthy again")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_unhealthy_without_a_worker():
    code, text = health()
    assert code == 1
    assert f"0 worker(s) of host {socket.gethostname()!r}" in text


def test_another_host_is_checked_by_name():
    Worker.objects.create(id="w-elsewhere", hostname="elsewhere", pid=1, concurrency=1)
    assert health("--host", "elsewhere")[0] == 0
    assert health("--host", "nowhere")[0] == 1
    Worker.objects.filter(id="w-elsewhere").update(last_seen_at=timezone.now() - timedelta(hours=1))
    code, text = health("--host", "elsewhere")
    assert code == 1 and "w-elsewhere" in text  # another host's pids cannot be checked from here


def test_a_dead_workers_leftover_row_does_not_fail_the_probe():
    """A SIGKILLed worker's row stays until the leader deletes it: not a stuck worker."""
    here = socket.gethostname()
    gone = _a_pid_not_running()
    long_ago = timezone.now() - timedelta(minutes=2)
    Worker.objects.create(id="dead", hostname=here, pid=gone, concurrency=1)
    Worker.objects.filter(id="dead").update(last_seen_at=long_ago)
    code, text = health()
    assert code == 1 and "0 worker(s)" in text  # no live worker, but none stuck either
    Worker.objects.create(id="alive", hostname=here, pid=os.getpid(), concurrency=1)
    assert health() == (0, f"healthy: 1 worker(s) of host {here!r} heartbeat within 2 s\n")
    # A restarted container: the new worker got the dead one's pid.
    Worker.objects.create(id="old-same-pid", hostname=here, pid=os.getpid(), concurrency=1)
    Worker.objects.filter(id="old-same-pid").update(last_seen_at=long_ago)
    assert health()[0] == 0


def test_min_workers():
    Worker.objects.create(id="a", hostname=socket.gethostname(), pid=os.getpid(), concurrency=1)
    assert health("--min-workers", "1")[0] == 0
    code, text = health("--min-workers", "2")
    assert code == 1 and "expected at least 2" in text


def test_bad_options_say_what_to_fix():
    assert health("--max-age", "0")[1] == "--max-age must be positive seconds, got 0."


@pytest.mark.slow  # runs another interpreter
def test_no_database_is_exit_status_2():
    """The whole command, as a probe runs it: the exit status says which check failed."""
    connection.ensure_connection()
    name = "no_such_database_here" if ON_POSTGRES else "/nonexistent/dir/db.sqlite3"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DISPATCH_DB_NAME": name}
    out = subprocess.run(
        [sys.executable, "-m", "django", "dispatch_health"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "did not answer" in out.stderr


def test_a_real_probe_exits_0_then_1(start_worker):
    """The exit status itself, from a separate process, as Kubernetes runs it."""
    connection.ensure_connection()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DISPATCH_DB_NAME": str(connection.settings_dict["NAME"]),
    }

    def probe() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "django", "dispatch_health"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    worker = start_worker("--worker-id", "probed")
    wait_until(lambda: registered("probed"), timeout=30)
    assert probe().returncode == 0
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    failed = probe()
    assert failed.returncode == 1 and "unhealthy" in failed.stderr


def _a_pid_not_running() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid += 1
