"""``manage.py dispatch_status``: workers, leader, queue depths, oldest waiting job.

``--json`` prints the same snapshot as one JSON document for scripts; its
schema is documented in docs/operating.md and versioned by ``SCHEMA``.
"""

import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ... import store
from ...conf import get_settings
from ...core import resources
from ...queries.status import Status, snapshot
from ...store.resources import unplaceable
from ..backend_option import add_backend_argument, backend_namespace

#: The version of the ``--json`` document: raised when a field changes meaning or
#: goes away (adding a field does not raise it).
SCHEMA = 1


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def as_json(status: Status, *, backend: str, namespace: str, unplaced: list) -> dict[str, Any]:
    """The ``--json`` document: every number of the text report, typed (seconds as
    floats, instants as ISO 8601 UTC strings from the database's clock)."""
    return {
        "schema": SCHEMA,
        "backend": backend,
        "namespace": namespace,
        "now": _when(status.now),
        "leader": None
        if status.leader is None
        else {"worker_id": status.leader[0], "lease_valid": status.leader[1]},
        "workers": [
            {
                "id": w.id,
                "hostname": w.hostname,
                "pid": w.pid,
                "queues": list(w.queues),
                "concurrency": w.concurrency,
                "running_jobs": w.running_jobs,
                "last_seen_at": _when(w.last_seen_at),
                "seen_seconds_ago": round((status.now - w.last_seen_at).total_seconds(), 3),
                "capacity": w.capacity or None,
                "locality": w.locality or None,
            }
            for w in status.workers
        ],
        "queues": [
            {
                "name": q.name,
                "pending": q.pending,
                "blocked": q.blocked,
                "running": q.running,
                "scheduled": q.scheduled,
                "oldest_waiting_seconds": None
                if q.oldest_due is None
                else round(q.oldest_due.total_seconds(), 3),
                "paused": q.paused,
            }
            for q in status.queues
        ],
        "unplaceable": [{"needs": dict(needs), "jobs": count} for needs, count in unplaced],
        "dead_letters_unreplayed": status.dead_letters_unreplayed,
        "cron": [
            {
                "name": e.name,
                "schedule": e.schedule,
                "timezone": e.timezone,
                "enabled": e.enabled,
                "last_run_at": _when(e.last_run_at),
                "next_run_at": _when(e.next_run_at),
            }
            for e in status.cron
        ],
    }


class Command(BaseCommand):
    help = "Print django_dispatch's workers, leader, queue depths and cron entries."

    def add_arguments(self, parser: CommandParser) -> None:
        add_backend_argument(parser, "to report on")
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print one JSON document (its schema is in the operating guide) instead of text.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        namespace = backend_namespace(options["backend"])
        with store.using_backend(options["backend"]) as db:
            status = snapshot(namespace)
            live = get_settings().LEASE_SECONDS
            unplaced = unplaceable(db, namespace, live_within=live)
        if options["json"]:
            document = as_json(
                status, backend=options["backend"], namespace=namespace, unplaced=unplaced
            )
            self.stdout.write(json.dumps(document, indent=2))
            return
        self.report(status, namespace, unplaced)

    def report(self, status: Status, namespace: str, unplaced: list) -> None:
        out = self.stdout.write
        if namespace:
            out(f"Namespace: {namespace}")
        if status.leader is None:
            out("Leader: none (none elected yet, or the last one stopped cleanly)")
        else:
            holder, valid = status.leader
            out(
                f"Leader: {holder}"
                + ("" if valid else " (lease expired: it stopped renewing without a clean stop)")
            )
        out(f"Workers ({len(status.workers)}):")
        for w in status.workers:
            seen = (status.now - w.last_seen_at).total_seconds()
            queues = ",".join(w.queues) or "all"
            out(
                f"  {w.id}  host={w.hostname} pid={w.pid} queues={queues} "
                f"concurrency={w.concurrency} running={w.running_jobs} seen={seen:.0f}s ago"
                + (f" capacity={resources.key_of(w.capacity)}" if w.capacity else "")
                + (f" locality={w.locality}" if w.locality else "")
            )
        out("Queues:")
        if not status.queues:
            out("  (no live jobs)")
        for q in status.queues:
            age = f"{q.oldest_due.total_seconds():.1f}s" if q.oldest_due is not None else "-"
            out(
                f"  {q.name}: pending={q.pending} blocked={q.blocked} running={q.running} "
                f"scheduled={q.scheduled} oldest_waiting={age}" + (" PAUSED" if q.paused else "")
            )
        for needs, count in unplaced:
            self.stderr.write(  # a warning, not an error (workers come and go)
                f"WARNING: {count} pending job(s) need {resources.key_of(needs)}, which no "
                "live worker's capacity can hold: start one with rundispatch --capacity."
            )
        out(f"Dead letters not replayed: {status.dead_letters_unreplayed}")
        out(f"Cron entries ({len(status.cron)}):")
        for e in status.cron:
            state = "enabled" if e.enabled else "disabled"
            out(
                f"  {e.name}: '{e.schedule}' {e.timezone} {state} "
                f"last={e.last_run_at or '-'} next={e.next_run_at or '-'}"
            )
