"""``manage.py rundispatch``: argument parsing and start-up checks only.

A worker process that has to end task code ignoring its timeout or its
cancel re-executes this same command line (see ``runtime.recycling``); the
new program finds a handover through its environment and carries on as the
same worker: under ``--processes``, as the same child, not as a new
supervisor. Only a process whose own command line started the command may do
that (``run_from_argv`` below; not ``call_command`` from a script or a test).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import store
from ...backend import DispatchBackend
from ...checks import unapplied_migrations
from ...compat import task_backends
from ...conf import get_settings
from ...core import resources
from ...observability import exposition, metrics
from ...runtime import recycling, stop_signals
from ...runtime.options import WorkerOptions, default_worker_id
from ...runtime.supervisor import supervise
from ...runtime.worker import Worker
from ..backend_option import add_backend_argument, backend_namespace

#: Job threads per process: each holds its own database connection, and far
#: past this the process cannot start them (``can't start new thread``).
MAX_CONCURRENCY = 1000
#: Async slots per process: coroutines on one event loop, cheap but not free.
MAX_ASYNC_CONCURRENCY = 10_000
#: Worker processes under one supervisor.
MAX_PROCESSES = 256


def whole_number(option: str, low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for ``option``: a whole number from ``low`` to ``high``.

    Its error is argparse's whole message (``ArgumentTypeError``), so the user
    reads what was wrong and the range, not the name of this function.
    """

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < low or (high is not None and number > high):
            bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"
            hint = (
                " (run more processes with --processes for more)"
                if option == "--concurrency"
                else ""
            )
            raise argparse.ArgumentTypeError(
                f"must be a whole number {bounds}{hint}, got {value!r}."
            )
        return number

    parse.__name__ = option  # what argparse would name if it ever fell back to it
    return parse


def _port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {value!r}.")
    return number


def add_pool_arguments(parser: CommandParser, concurrency: int) -> None:
    """What this command serves and with how many processes and slots."""
    parser.add_argument(
        "--queues", default="", help="Comma-separated queue names to serve (default: all)."
    )
    parser.add_argument(
        "--concurrency",
        type=whole_number("--concurrency", 1, MAX_CONCURRENCY),
        default=concurrency,
        help="Job threads per process (default: DISPATCH['CONCURRENCY']).",
    )
    parser.add_argument(
        "--async-concurrency",
        type=whole_number("--async-concurrency", 0, MAX_ASYNC_CONCURRENCY),
        default=0,
        help="Slots per process for async def tasks, run together on one event loop "
        "(default 0: each async job takes a job thread).",
    )
    parser.add_argument(
        "--processes",
        type=whole_number("--processes", 1, MAX_PROCESSES),
        default=1,
        help="Worker processes to fork under one supervisor.",
    )


def add_lifetime_arguments(parser: CommandParser) -> None:
    """When the worker stops, what it is called, and whether it schedules cron entries."""
    parser.add_argument(
        "--burst", action="store_true", help="Run every job runnable now, then exit 0."
    )
    parser.add_argument(
        "--max-jobs",
        type=whole_number("--max-jobs", 1),
        default=None,
        help="Exit after claiming this many jobs (per process).",
    )
    parser.add_argument("--worker-id", default=None, help="Worker id (default: host:pid:random).")
    parser.add_argument(
        "--no-scheduler",
        action="store_true",
        help="Do not run the cron scheduler in this worker.",
    )


def add_host_arguments(parser: CommandParser) -> None:
    """What this host serves operators (the Prometheus endpoint) and offers jobs
    with resource needs, and where it is."""
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        help="Serve Prometheus metrics on this port (needs django-dispatch[prometheus]); "
        "with --processes, one endpoint for all of them.",
    )
    parser.add_argument(
        "--metrics-addr",
        default="",
        help="Address the metrics endpoint listens on (default: all interfaces).",
    )
    parser.add_argument(
        "--capacity",
        default=None,
        help="What this host offers jobs with resource needs, e.g. memory_mb=8192,gpu=1 "
        "(default: DISPATCH['CAPACITY']; none: only jobs without needs run here). "
        "With --processes N, each process gets an Nth.",
    )
    parser.add_argument(
        "--locality",
        default=None,
        help="This worker's locality: jobs enqueued with the same locality are taken "
        "first among equal priorities (default: DISPATCH['LOCALITY']).",
    )


@dataclass(frozen=True)
class Launch:
    """What every worker this command starts shares; each adds its own id."""

    options: dict[str, Any]
    queues: list[str]
    namespace: str
    base_id: str
    capacity: dict[str, int]
    locality: str
    recycle: bool

    def worker_options(
        self, index: int | None, predecessor: recycling.Handover | None
    ) -> WorkerOptions:
        """A recycled worker keeps its predecessor's id; a supervised child gets ``.index``."""
        if predecessor is not None:
            worker_id = predecessor.worker_id
        else:
            worker_id = self.base_id if index is None else f"{self.base_id}.{index}"
        options = self.options
        return WorkerOptions(
            worker_id=worker_id,
            queues=self.queues,
            namespace=self.namespace,
            concurrency=options["concurrency"],
            async_concurrency=options["async_concurrency"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            shutdown_timeout=options["shutdown_timeout"],
            scheduler=not options["no_scheduler"],
            recycle=self.recycle,
            predecessor=predecessor,
            capacity=self.capacity,
            locality=self.locality,
            supervisor_pid=None if index is None else os.getppid(),
        )

    def run_one(self, index: int | None, predecessor: recycling.Handover | None = None) -> int:
        """Run one worker in this process; its exit code, unless it recycles the process.

        ``index`` is the supervised child's number (None: no supervisor).
        """
        worker = Worker(self.worker_options(index, predecessor))
        worker.install_signal_handlers()
        stop_log = stop_signals.StopSignalLog.open() if self.recycle else None
        # Stop signals held across a predecessor's recycle arrive now.
        stop_signals.release_stop_signals()
        if predecessor is not None:
            arrived = stop_signals.stop_signal_arrived(predecessor.stop_log)  # closes it
            if predecessor.stop or arrived:
                worker.request_stop("a stop signal during the recycle")
        try:
            code = worker.run()
            if worker.handover is not None:
                stop_signals.hold_stop_signals()  # from here on, a stop request waits
                worker.handover.child = index
                worker.handover.stop = stop_signals.stop_requested(worker)
                worker.handover.stop_log = None if stop_log is None else stop_log.pass_on()
                recycling.exec_successor(worker.handover)  # does not return
        finally:
            if stop_log is not None:
                stop_log.close()
        return code


class Command(BaseCommand):
    help = "Run django_dispatch jobs: claim, run, retry; SIGTERM drains gracefully."
    requires_system_checks: list[str] = []  # run below, with a clearer failure
    #: The command line that started this command, None when called from
    #: code: decides whether the worker may recycle its process.
    command_line: Sequence[str] | None = None

    def run_from_argv(self, argv: list[str]) -> None:
        """Started from a command line (``manage.py``, ``django-admin``, ``python -m django``)."""
        self.command_line = list(argv)
        super().run_from_argv(argv)

    def add_arguments(self, parser: CommandParser) -> None:
        cfg = get_settings()
        add_backend_argument(parser, "this worker serves")
        # Added in the order ``--help`` lists them.
        add_pool_arguments(parser, cfg.CONCURRENCY)
        add_lifetime_arguments(parser)
        add_host_arguments(parser)
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            default=cfg.SHUTDOWN_TIMEOUT,
            help="Seconds to let running jobs finish after SIGTERM.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Every thread of this process (job threads, heartbeat, listener, the
        # forked --processes children) works on the alias's database.
        served = store.routing.alias_database(options["backend"])
        store.serve_database(served)
        try:
            self._work(options)
        finally:
            store.serve_database(None)  # called from code: the caller's process goes on

    def _work(self, options: dict[str, Any]) -> None:
        self._check_ready()
        if not 1 <= options["concurrency"] <= MAX_CONCURRENCY:  # from DISPATCH["CONCURRENCY"]
            raise CommandError(
                f"DISPATCH['CONCURRENCY'] is {options['concurrency']}: it must be a whole number "
                f"from 1 to {MAX_CONCURRENCY} (run more processes with --processes for more)."
            )
        queues = [q.strip() for q in options["queues"].split(",") if q.strip()]
        self._check_queues(queues)
        capacity, locality = self._placement(options)
        launch = Launch(
            options=options,
            queues=queues,
            namespace=backend_namespace(options["backend"]),
            base_id=options["worker_id"] or default_worker_id(),
            capacity=capacity,
            locality=locality,
            recycle=recycling.can_recycle(self.command_line),
        )
        predecessor = recycling.Handover.from_environ()
        if options["metrics_port"] is not None and not metrics.AVAILABLE:
            raise CommandError(
                "--metrics-port needs prometheus-client: pip install 'django-dispatch[prometheus]'."
            )
        code = self._run(launch, predecessor)
        if code:
            raise SystemExit(code)

    def _check_ready(self) -> None:
        """System checks, the DISPATCH settings and the migrations, before any job is claimed."""
        self.check(display_num_errors=False)
        problems = get_settings().validate()
        if problems:
            raise CommandError("Invalid DISPATCH settings:\n  " + "\n  ".join(problems))
        db = store.db_alias()
        missing = unapplied_migrations(db)
        if missing:
            raise CommandError(
                f"django_dispatch's migrations {missing} are not applied on database "
                f"{db!r}. Run `python manage.py migrate --database {db}` first."
            )

    def _run(self, launch: Launch, predecessor: recycling.Handover | None) -> int:
        """Run the worker(s) with the metrics endpoint that fits how they run; their exit code.

        A recycled process carries on as the worker (or supervised child) it
        replaces; otherwise one worker runs here, or a supervisor forks
        ``--processes`` of them.
        """
        options = launch.options
        port, addr = options["metrics_port"], options["metrics_addr"]
        server: exposition.Server | None = None
        try:
            if predecessor is not None:  # this process replaced itself
                if port is not None:
                    server = self._serve(
                        exposition.resume_after_recycle, port, addr, predecessor.child
                    )
                return launch.run_one(predecessor.child, predecessor)
            if options["processes"] == 1:
                if port is not None:
                    server = self._serve(exposition.serve_single, port, addr)
                return launch.run_one(None)
            if port is not None:
                server = self._serve(exposition.serve_multiprocess, port, addr)
            return supervise(
                options["processes"],
                launch.run_one,
                restart=not (options["burst"] or options["max_jobs"]),
                in_child=server.in_child if server else None,
                child_exited=server.child_exited if server else None,
            )
        finally:
            if server is not None:
                server.close()

    @staticmethod
    def _placement(options: dict[str, Any]) -> tuple[dict[str, int], str]:
        """``--capacity`` (or the setting) divided among ``--processes``; ``--locality``."""
        cfg = get_settings()
        raw = options["capacity"] if options["capacity"] is not None else cfg.CAPACITY
        try:
            capacity = resources.check_capacity(raw, what="--capacity")
        except ValueError as e:
            raise CommandError(str(e)) from None
        locality = options["locality"] if options["locality"] is not None else cfg.LOCALITY
        if locality and len(locality) > resources.NAME_MAX_LENGTH:
            raise CommandError(f"--locality is longer than {resources.NAME_MAX_LENGTH} characters.")
        shares = resources.divide(capacity, options["processes"])
        lost = sorted(name for name, amount in capacity.items() if amount and not shares[name])
        if lost:  # a silent 0 would leave every job needing it pending for ever
            names = ", ".join(f"{name}={capacity[name]}" for name in lost)
            raise CommandError(
                f"--capacity {names} divided among --processes {options['processes']} leaves "
                f"each process none of it, so no job needing {' or '.join(lost)} could run. "
                "Give this host --processes 1, or run one rundispatch per device, each with "
                "its own --capacity."
            )
        return shares, locality

    @staticmethod
    def _serve(start: Any, port: int, addr: str, *args: Any) -> exposition.Server | None:
        try:
            server: exposition.Server | None = start(port, addr, *args)
        except OSError as e:
            raise CommandError(
                f"--metrics-port {port}: cannot listen on {addr or 'all interfaces'}: {e}. "
                "Choose a free port."
            ) from e
        return server

    def _check_queues(self, queues: list[str]) -> None:
        backends = [b for b in task_backends.all() if isinstance(b, DispatchBackend)]
        if not backends:
            raise CommandError(
                "No TASKS backend uses django_dispatch.backend.DispatchBackend; "
                "set TASKS['default']['BACKEND'] to it."
            )
        known: set[str] = set()
        for backend in backends:
            if not backend.queues:  # [] accepts any queue name
                return
            known |= backend.queues
        unknown = sorted(set(queues) - known)
        if unknown:
            raise CommandError(
                f"--queues names {unknown}, which no DispatchBackend accepts "
                f"(QUEUES: {sorted(known)}). Fix --queues or TASKS[...]['QUEUES']."
            )
