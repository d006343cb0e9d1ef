"""Enqueue one job of each demo task, and show what enqueue returns."""

from datetime import timedelta

from django.core.management.base import BaseCommand
from django.utils import timezone

from django_dispatch import cancel, enqueue_many
from django_dispatch.compat import TaskResult
from shop import tasks


class Command(BaseCommand):
    help = "Enqueue one job of each demo task (run `rundispatch --burst` next)."

    def handle(self, *args, **options):
        results: list[tuple[str, TaskResult]] = [
            ("plain task", tasks.send_welcome.enqueue(1)),
            ("priority 10, queue 'emails'", tasks.send_receipt.enqueue(1001, "ada@example.com")),
            ("fails once, then retries", tasks.charge_card.enqueue(1001, amount_cents=4200)),
            ("atomic: paid once", tasks.record_payment.enqueue(1001, 4200, "ada@example.com")),
            ("async def task", tasks.fetch_exchange_rate.enqueue("USD")),
            ("checkpoints, resumes", tasks.rebuild_search_index.enqueue(5)),
            ("within its timeout", tasks.generate_report.enqueue(0.1)),
            ("over its timeout", tasks.generate_report.enqueue(5)),
            ("saves a CSV artifact", tasks.export_deliveries.enqueue()),
        ]

        # Many calls of one task in a single INSERT.
        calls = [([user_id], {}) for user_id in (2, 3, 4)]
        for result in enqueue_many(tasks.send_welcome, calls, return_results=True):
            results.append(("enqueue_many", result))

        # Orders partitioned by customer: one customer's orders run one at a
        # time and in order (even when later ones have a higher priority);
        # different customers' orders run in parallel.
        for priority, (customer, order) in enumerate([(1, 501), (2, 601), (1, 502), (1, 503)]):
            order_task = tasks.process_order.using(
                partition_key=f"customer:{customer}", priority=priority
            )
            results.append(
                (f"order {order}, customer:{customer}", order_task.enqueue(customer, order))
            )

        # An idempotency key: while the first job is live, enqueuing again
        # with the same key returns that job instead of adding one.
        welcome_7 = tasks.send_welcome.using(idempotency_key="welcome-user-7")
        first, again = welcome_7.enqueue(7), welcome_7.enqueue(7)
        results.append((f"idempotency key (again: #{again.id})", first))

        # A job that is cancelled before any worker sees it.
        cancelled = tasks.send_welcome.enqueue(5)
        cancel(cancelled.id)
        results.append(("cancelled at once", cancelled))

        # A job deferred with run_after: `--burst` leaves it for later.
        later = tasks.send_welcome.using(run_after=timezone.now() + timedelta(hours=1))
        results.append(("deferred by an hour", later.enqueue(6)))

        self.stdout.write(f"Enqueued {len(results)} jobs:")
        for label, result in results:
            result.refresh()  # the cancelled one changed since enqueue
            self.stdout.write(
                f"  #{result.id:<5} {result.task.name:<22} {result.status:<10} ({label})"
            )
        self.stdout.write(
            "Next: python manage.py rundispatch --burst && python manage.py show_demo"
        )
