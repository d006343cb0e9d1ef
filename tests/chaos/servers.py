"""A PostgreSQL cluster and a PgBouncer of the chaos suite's own, to crash and restart.

The rest of the suite shares the server scripts/with-postgres started; the
chaos tests must not take that one down, so they start their own, the same
way (initdb into a temporary directory, a free loopback port, as the
``postgres`` user when run as root since neither program runs as root).
Both keep their port across restarts, so clients reconnect to the same
address, as they would after a failover behind a fixed DNS name.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

INSTALL_HINT = (
    "run scripts/ensure-postgres (as root it installs Debian's postgresql and pgbouncer), "
    "or install them yourself"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                text = log.read_text() if log.exists() else "(no log)"
                raise RuntimeError(f"{what} did not listen on port {port}:\n{text}") from None
            time.sleep(0.05)


class _Owned:
    """A temporary directory the server's user can write, and how to run as it."""

    def __init__(self, prefix: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]

    def run(self, *command: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.as_user, *map(str, command)], capture_output=True, text=True, check=check
        )

    def write(self, name: str, text: str) -> Path:
        path = self.dir / name
        path.write_text(text)
        if self.as_user:
            shutil.chown(path, "postgres")
        return path


class PostgresServer(_Owned):
    """A throwaway cluster: ``crash()`` is ``pg_ctl -m immediate stop``."""

    def __init__(self) -> None:
        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
        candidates.append(os.path.dirname(shutil.which("initdb") or "/nonexistent/initdb"))
        bins = [d for d in candidates if os.access(f"{d}/pg_ctl", os.X_OK)]
        if not bins:
            raise RuntimeError(f"PostgreSQL's initdb and pg_ctl were not found: {INSTALL_HINT}.")
        super().__init__("dispatch-chaos-pg.")
        self.bin = Path(bins[0])
        self.port = free_port()
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        done = self.run(
            self.bin / "initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
            check=False,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"initdb failed:\n{done.stdout}{done.stderr}")

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
            "-c max_connections=300 -c fsync=off"
        )
        done = self.run(
            self.bin / "pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60",
            "-o", options, "start",
            check=False,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"PostgreSQL did not start:\n{self.log.read_text()}")

    def crash(self) -> None:
        """Stop at once, as a crash would: no checkpoint, every session cut."""
        self.run(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "stop")

    def execute(self, sql: str, params: list | None = None) -> list[tuple]:
        """Run one statement as the superuser, outside any transaction."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def destroy(self) -> None:
        self.run(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


class PgBouncer(_Owned):
    """PgBouncer in transaction mode in front of ``server``: ``restart()`` cuts every client."""

    def __init__(self, server: PostgresServer) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f"pgbouncer was not found: {INSTALL_HINT}.")
        super().__init__("dispatch-chaos-bouncer.")
        self.binary = binary
        self.port = free_port()
        self.log = self.dir / "pgbouncer.log"
        self.pidfile = self.dir / "pgbouncer.pid"
        self.write("userlist.txt", '"postgres" ""\n')
        self.ini = self.write(
            "pgbouncer.ini",
            f"""[databases]
* = host=127.0.0.1 port={server.port} user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 80
server_login_retry = 1
ignore_startup_parameters = extra_float_digits,options
logfile = {self.log}
pidfile = {self.pidfile}
""",
        )

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        done = self.run(self.binary, "-d", "-q", self.ini, check=False)
        if done.returncode:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"pgbouncer did not start:\n{done.stderr}{log}")
        _wait_for_port(self.port, 30, "pgbouncer", self.log)

    def stop(self) -> None:
        """SIGTERM: PgBouncer's immediate shutdown, every client connection cut."""
        try:
            pid = int(self.pidfile.read_text())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _version(path: str) -> tuple[int, ...]:
    name = Path(path).parent.name
    return tuple(int(p) for p in name.split(".") if p.isdigit())
