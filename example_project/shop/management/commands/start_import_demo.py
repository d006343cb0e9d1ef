"""Start a demo import of an uploaded contact list (``shop.imports``), optionally run it."""

from django.core.management import call_command
from django.core.management.base import BaseCommand

from shop.imports import import_upload

NAMES = ["Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "John", "Radia", "Ken"]


def demo_csv(rows: int) -> str:
    lines = ["email,name"]
    for i in range(rows):
        name = f"{NAMES[i % len(NAMES)]} {i}"
        lines.append(f"{name.split()[0].lower()}.{i}@example.com,{name}")
    return "\n".join(lines) + "\n"


class Command(BaseCommand):
    help = "Import a demo contact list: one child run per row, at most four at once."

    def add_arguments(self, parser):
        parser.add_argument("--rows", type=int, default=25, help="Rows in the demo upload.")
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Then run a worker until nothing is left to do (rundispatch --burst).",
        )

    def handle(self, *args, **options):
        name = f"contacts-{options['rows']}.csv"
        run = import_upload.start(
            {"name": name, "csv": demo_csv(options["rows"])}, idempotency_key=f"import-{name}"
        )
        self.stdout.write(f"import_upload run #{run.pk} for {name} ({run.state})")
        if not options["burst"]:
            self.stdout.write("Next: python manage.py rundispatch --burst")
            return
        call_command("rundispatch", "--burst")
        run.refresh_from_db()
        self.stdout.write(
            f"  run #{run.pk}: {run.state}, output {run.output}; {run.children.count()} child runs"
        )
        self.stdout.write(
            f"Watch it in the admin: /admin/django_dispatch/workflowrun/{run.pk}/change/ "
            "(the import_rows node shows done/total and links to the rows' runs)."
        )
