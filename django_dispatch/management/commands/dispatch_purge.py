"""``manage.py dispatch_purge``: apply retention now (the leader also does it)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ... import store
from ...services import purge
from ..backend_option import add_backend_argument, backend_namespace


class Command(BaseCommand):
    help = "Delete finished jobs and dead letters older than their retention (DISPATCH)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--max-seconds",
            type=float,
            default=300.0,
            help="Stop after this long; run again to continue.",
        )
        add_backend_argument(parser, "to purge")

    def handle(self, *args: Any, **options: Any) -> None:
        namespace = backend_namespace(options["backend"])
        with store.using_backend(options["backend"]):
            jobs, letters = purge(max_seconds=options["max_seconds"], namespace=namespace)
        self.stdout.write(f"Deleted {jobs} finished jobs and {letters} dead letters.")
