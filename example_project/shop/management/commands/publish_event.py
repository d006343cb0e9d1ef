"""Publish an event from the command line (``django_dispatch.events.publish``)."""

import json

from django.core.management.base import BaseCommand, CommandError

from django_dispatch import events


class Command(BaseCommand):
    help = "Publish an event; workflow steps waiting on it resume, one subscriber gets it."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--key", default=None)
        parser.add_argument("--payload", default="null", help="JSON (default: null).")

    def handle(self, *args, **options):
        try:
            payload = json.loads(options["payload"])
        except ValueError as e:
            raise CommandError(f"--payload is not JSON: {e}") from None
        try:
            event_id = events.publish(options["name"], payload, key=options["key"])
        except (TypeError, ValueError) as e:
            raise CommandError(str(e)) from None
        self.stdout.write(f"event #{event_id} {options['name']!r} published")
