"""A throwaway PostgreSQL server for one benchmark run.

``initdb`` into a temporary directory, start on a free loopback port with
PostgreSQL's default durability (``fsync`` and ``synchronous_commit`` on; only
the port, the socket directory and ``max_connections`` are set), hand out a
fresh database per measurement, and stop and delete everything at the end.
Runs the server as the ``postgres`` user when started as root, since
PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import contextlib
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

#: Enough for every worker connection of the largest configuration.
MAX_CONNECTIONS = 200


def find_bin_dir() -> Path:
    """The newest PostgreSQL server binary directory with initdb and pg_ctl."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[4]))
    for directory in [*reversed(candidates), "/usr/local/bin", "/usr/bin"]:
        if (Path(directory) / "initdb").exists() and (Path(directory) / "pg_ctl").exists():
            return Path(directory)
    raise SystemExit(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """Context manager: a running server; ``url(db)`` for a database on it."""

    def __init__(
        self, max_connections: int = MAX_CONNECTIONS, settings: dict[str, str] | None = None
    ) -> None:
        self.max_connections = max_connections
        #: More ``-c name=value`` server settings (the fleet check: pg_stat_statements,
        #: log_lock_waits); none by default, so that the other measurements run at
        #: the server's defaults.
        self.extra_settings = settings or {}
        self.bin = find_bin_dir()
        self.port = free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix="dispatch-bench-pg."))
        self.data = self.tmp / "data"
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        log = self.tmp / "cmd.log"
        with open(log, "w") as out:
            code = subprocess.run(
                [*self.as_postgres, *args], stdout=out, stderr=subprocess.STDOUT
            ).returncode
        if code:
            raise RuntimeError(f"{args[0]} failed:\n{log.read_text()}")

    def __enter__(self) -> PgServer:
        if self.as_postgres:
            shutil.chown(self.tmp, "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "-E", "UTF8")  # fmt: skip
        options = (
            f"-p {self.port} -k {self.tmp} -c listen_addresses=127.0.0.1 "
            f"-c max_connections={self.max_connections}"
        )
        for name, value in self.extra_settings.items():
            options += f" -c {name}={value}"
        log = str(self.tmp / "server.log")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", log,
                  "-w", "-t", "60", "-o", options, "start")  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(RuntimeError):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.url(), autocommit=True)

    def create_database(self, name: str) -> str:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def settings(self) -> dict[str, str]:
        """The server settings a reader of the results needs to know."""
        names = ["server_version", "fsync", "synchronous_commit", "full_page_writes",
                 "shared_buffers", "max_connections"]  # fmt: skip
        with self.admin() as conn:
            return {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}


class PgBouncer:
    """Context manager: Debian's ``pgbouncer`` in transaction mode in front of ``server``.

    As ``scripts/with-postgres`` starts it for the test suite: any database
    name is forwarded, clients authenticate with trust. ``pool_size`` server
    connections per database at most, however many clients connect.
    """

    def __init__(self, server: PgServer, pool_size: int = 20, max_client_conn: int = 2000) -> None:
        self.server, self.pool_size, self.max_client_conn = server, pool_size, max_client_conn
        self.port = free_port()
        self.tmp = server.tmp / "pgbouncer"

    def __enter__(self) -> PgBouncer:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise RuntimeError("pgbouncer not found: apt-get install pgbouncer")
        self.tmp.mkdir()
        (self.tmp / "userlist.txt").write_text('"postgres" ""\n')
        (self.tmp / "pgbouncer.ini").write_text(
            f"[databases]\n* = host=127.0.0.1 port={self.server.port} user=postgres\n\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            "unix_socket_dir =\nauth_type = trust\n"
            f"auth_file = {self.tmp}/userlist.txt\npool_mode = transaction\n"
            f"max_client_conn = {self.max_client_conn}\ndefault_pool_size = {self.pool_size}\n"
            # The admin console (``SHOW POOLS``), for the fleet check's samples of
            # clients waiting for a server connection.
            "admin_users = postgres\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.tmp}/pgbouncer.log\npidfile = {self.tmp}/pgbouncer.pid\n"
        )
        if self.server.as_postgres:
            for path in [self.tmp, *self.tmp.iterdir()]:
                shutil.chown(path, "postgres")
        self.server._run(binary, "-d", "-q", str(self.tmp / "pgbouncer.ini"))
        for _ in range(300):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            time.sleep(0.05)
        raise RuntimeError("pgbouncer did not start: " + (self.tmp / "pgbouncer.log").read_text())

    def __exit__(self, *exc: object) -> None:
        pidfile = self.tmp / "pgbouncer.pid"
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def pid(self) -> int:
        """PgBouncer's process id (one process, one thread: its CPU is one core at most)."""
        return int((self.tmp / "pgbouncer.pid").read_text().strip())
