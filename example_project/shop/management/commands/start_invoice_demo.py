"""Start an invoice run that waits durably for its payment event."""

from django.core.management.base import BaseCommand

from shop.workflows import invoice


class Command(BaseCommand):
    help = "Start an invoice workflow run that waits for a 'payment.received' event."

    def add_arguments(self, parser):
        parser.add_argument("--invoice-id", type=int, default=7)
        parser.add_argument(
            "--timeout",
            type=float,
            default=3 * 86400,
            help="Seconds to wait for the payment before voiding the invoice (default 3 days).",
        )

    def handle(self, *args, **options):
        invoice_id = options["invoice_id"]
        run = invoice.start(
            {"invoice_id": invoice_id, "email": "ada@example.com", "timeout": options["timeout"]},
            idempotency_key=f"invoice-{invoice_id}",
            context={"started_by": "manage.py start_invoice_demo"},
        )
        self.stdout.write(f"invoice run #{run.pk} for invoice {invoice_id} ({run.state})")
        self.stdout.write(
            "Run a worker (python manage.py rundispatch): the run sends the invoice, then "
            "waits, holding no worker. Then pay it:\n"
            f"  python manage.py publish_event payment.received --key invoice:{invoice_id} "
            "--payload '{\"amount_cents\": 4200}'\n"
            "or from the admin: Events -> Publish an event..."
        )
