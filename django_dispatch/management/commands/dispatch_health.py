"""``manage.py dispatch_health``: exit 0 when this host's workers heartbeat and the
database answers; non-zero with the reason otherwise (see ``observability.health``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import store
from ...conf import get_settings
from ...observability.health import check
from ..backend_option import backend_namespace


class Command(BaseCommand):
    help = (
        "Liveness probe: exit 0 when this host's django_dispatch workers heartbeat in time "
        "and the database answers; 1 (workers) or 2 (database) with the reason otherwise."
    )
    # A probe runs every few seconds: no system checks, nothing but its two queries.
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            default="default",
            help="TASKS alias whose workers to check: they register in its database "
            "(OPTIONS['DATABASE']; default: default).",
        )
        parser.add_argument(
            "--host",
            default=None,
            help="Check the workers of this hostname (default: this machine's, as the "
            "workers record it).",
        )
        parser.add_argument(
            "--max-age",
            type=float,
            default=None,
            help="Seconds since a worker's last heartbeat after which it counts as stuck "
            "(default: DISPATCH['LEASE_SECONDS'], when its jobs' leases would run out).",
        )
        parser.add_argument(
            "--min-workers",
            type=int,
            default=1,
            help="How many worker processes of the host must heartbeat (default 1; "
            "with --processes P, P).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        max_age = options["max_age"]
        if max_age is None:
            max_age = get_settings().LEASE_SECONDS
        if max_age <= 0:
            raise CommandError(f"--max-age must be positive seconds, got {max_age:g}.")
        if options["min_workers"] < 0:
            raise CommandError(f"--min-workers must be 0 or more, got {options['min_workers']}.")
        if options["backend"] != "default":  # an unknown alias: CommandError naming them
            backend_namespace(options["backend"])
        with store.using_backend(options["backend"]):
            health = check(
                host=options["host"], max_age=max_age, min_workers=options["min_workers"]
            )
        if not health.healthy:
            raise CommandError(f"unhealthy: {health.reason}", returncode=health.status)
        if options["verbosity"] >= 1:
            self.stdout.write(f"healthy: {health.reason}")
