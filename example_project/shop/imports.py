"""Demo of ``ctx.map``: import an uploaded contact list, one child run per row.

``import_upload`` parses the CSV it is given, then maps ``import_row`` over
the rows (at most four at once, whatever the number of workers), then sums
up. Each row is its own run, with its own retries: a row that keeps failing
gets stuck alone, and the upload waits for it instead of starting over. The
summary reads the children's outputs in row order.

Saving a row is an upsert by e-mail, so a row whose worker died after the
write and that runs again changes nothing (steps run at least once).
"""

import csv
import io

from django.db import IntegrityError

from django_dispatch.workflows import Workflow

from .models import Contact, Delivery

# --- one row: a child run -----------------------------------------------------------

import_row = Workflow("import_row")


@import_row.step(max_attempts=3, backoff=1)
def save_row(ctx):
    email = ctx.input["email"].strip().lower()
    if "@" not in email:
        raise ValueError(f"row {ctx.input['line']}: {email!r} is not an e-mail address")
    name = ctx.input["name"].strip()
    # An UPDATE, then an INSERT if it matched nothing: single statements, so
    # that on SQLite a row never reads in a transaction it then writes in
    # (which fails at once with "database is locked" under concurrent rows).
    created = not Contact.objects.filter(email=email).update(name=name)
    if created:
        try:
            Contact.objects.create(email=email, name=name)
        except IntegrityError:  # the same e-mail on another row, saved just now
            created = not Contact.objects.filter(email=email).update(name=name)
    contact = Contact.objects.get(email=email)
    Delivery.objects.create(
        task=f"save_row (run {ctx.run_id})", attempt=ctx.attempt, detail=f"saved {email}"
    )
    return {"line": ctx.input["line"], "contact": contact.pk, "created": created}


# --- the upload: maps import_row over its rows -----------------------------------------

import_upload = Workflow("import_upload")


@import_upload.step()
def read_rows(ctx):
    """The CSV's rows as JSON (a real upload would be read from storage by its id)."""
    reader = csv.DictReader(io.StringIO(ctx.input["csv"]))
    return [
        {"line": line, "email": row["email"], "name": row["name"]}
        for line, row in enumerate(reader, start=2)
    ]


@import_upload.step()
def import_rows(ctx):
    return ctx.map(import_row, ctx.outputs["read_rows"], max_parallel=4)


@import_upload.step()
def summarize(ctx):
    results = ctx.outputs["import_rows"]  # one per row, in the order of the file
    created = sum(1 for r in results if r["created"])
    Delivery.objects.create(
        task=f"summarize (run {ctx.run_id})",
        detail=f"upload {ctx.input['name']}: {len(results)} rows, {created} new contacts",
    )
    return {"rows": len(results), "created": created, "updated": len(results) - created}
