"""``manage.py dispatch_status``: workers, leader, queue depths, oldest waiting job."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ... import store
from ...conf import get_settings
from ...core import resources
from ...queries.status import snapshot
from ...store.resources import unplaceable
from ..backend_option import add_backend_argument, backend_namespace


class Command(BaseCommand):
    help = "Print django_dispatch's workers, leader, queue depths and cron entries."

    def add_arguments(self, parser: CommandParser) -> None:
        add_backend_argument(parser, "to report on")

    def handle(self, *args: Any, **options: Any) -> None:
        namespace = backend_namespace(options["backend"])
        status = snapshot(namespace)
        live = get_settings().LEASE_SECONDS
        out = self.stdout.write
        if namespace:
            out(f"Namespace: {namespace}")
        if status.leader is None:
            out("Leader: none yet")
        else:
            holder, valid = status.leader
            out(f"Leader: {holder}" + ("" if valid else " (lease expired)"))
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
                f"oldest_waiting={age}" + (" PAUSED" if q.paused else "")
            )
        for needs, count in unplaceable(store.db_alias(), namespace, live_within=live):
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
