"""``manage.py dispatch_queue pause|resume|list [NAME]``: pause and resume queues, list them."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import flow
from ..backend_option import add_backend_argument


class Command(BaseCommand):
    help = (
        "Pause or resume a queue (no new job of it starts; running jobs finish; enqueue "
        "keeps working), or list queues with their paused state, backlog and limits."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume", "list"])
        parser.add_argument("name", nargs="?", help="The queue (required for pause/resume).")
        add_backend_argument(parser, "to act on")

    def handle(self, *args: Any, **options: Any) -> None:
        action, name, backend = options["action"], options["name"], options["backend"]
        if action == "list":
            self._list(name, backend)
            return
        if not name:
            raise CommandError(f"dispatch_queue {action} needs a queue name.")
        try:
            changed = (flow.pause_queue if action == "pause" else flow.resume_queue)(
                name, backend=backend
            )
        except ValueError as e:
            raise CommandError(str(e)) from e
        done = "paused" if action == "pause" else "resumed"
        if changed:
            self.stdout.write(f"Queue {name!r} {done}.")
        else:
            state = "already paused" if action == "pause" else "not paused"
            self.stdout.write(f"Queue {name!r} was {state}; nothing changed.")

    def _list(self, name: str | None, backend: str) -> None:
        try:
            queues = flow.queue_overview(backend=backend)
        except ValueError as e:
            raise CommandError(str(e)) from e
        if name:
            queues = [q for q in queues if q.name == name]
        if not queues:
            self.stdout.write("(no queues with live jobs, paused or configured)")
        for q in queues:
            state = f"PAUSED since {q.paused_at:%Y-%m-%d %H:%M:%S}" if q.paused else "active"
            cap = f"/{q.concurrency}" if q.concurrency is not None else ""
            rate = f" starts={q.starts} rate_limit={q.rate_limit}" if q.rate_limit else ""
            self.stdout.write(
                f"{q.name}: {state} pending={q.pending} blocked={q.blocked} "
                f"running={q.running}{cap}{rate}"
            )
        if name:
            return
        for g in flow.groups_at_cap(backend=backend):
            cap = f" running={g.running}" + (f"/{g.limit}" if g.limit else "")
            rate = f" starts={g.starts}/{g.rate}" if g.rate else ""
            self.stdout.write(
                f"at cap: {g.task_path} [{g.concurrency_key or 'task-wide'}]{cap}{rate} "
                f"waiting={g.blocked}"
            )
