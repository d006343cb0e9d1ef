"""Start demo checkout runs, optionally run them, and say where to watch them."""

from django.core.management import call_command
from django.core.management.base import BaseCommand

from django_dispatch.models import WorkflowRun
from shop.workflows import checkout

ORDERS = [
    {
        "order_id": 1001,
        "email": "ada@example.com",
        "card": "visa",
        "amount_cents": 4200,
        "items": ["teapot", "cups"],
    },
    {
        "order_id": 1002,
        "email": "alan@example.com",
        "card": "declined",
        "amount_cents": 990,
        "items": ["kettle"],
    },
]


class Command(BaseCommand):
    help = "Start two checkout workflow runs (one gets stuck on a declined card)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Then run a worker until nothing is left to do (rundispatch --burst).",
        )

    def handle(self, *args, **options):
        runs = []
        for order in ORDERS:
            # The idempotency key makes running this command twice harmless:
            # the second start returns the run the first one created.
            run = checkout.start(order, idempotency_key=f"order-{order['order_id']}")
            runs.append(run)
            self.stdout.write(f"checkout run #{run.pk} for order {order['order_id']} ({run.state})")
        if options["burst"]:
            call_command("rundispatch", "--burst")
            self.stdout.write("After the worker:")
            for run in runs:
                run.refresh_from_db()
                children = ", ".join(f"#{c.pk} {c.name} {c.state}" for c in run.children.all())
                self.stdout.write(
                    f"  run #{run.pk}: {run.state}, output {run.output}"
                    + (f"; child runs: {children}" if children else "")
                )
        else:
            self.stdout.write("Next: python manage.py rundispatch --burst")
        stuck = WorkflowRun.objects.filter(name="checkout", state="stuck").count()
        self.stdout.write(
            "Watch them in the admin: /admin/django_dispatch/workflowrun/ "
            "(python manage.py createsuperuser, then runserver)."
        )
        if stuck:
            self.stdout.write(
                f"{stuck} run(s) are stuck on a declined card: select them and run the "
                "'Retry selected stuck runs' action, then run the worker again."
            )
