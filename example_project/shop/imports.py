"""Demo of ``ctx.map``: import an uploaded contact list, one child run per row.

``import_upload`` parses the CSV it is given, then maps ``import_row`` over
the rows (at most four at once, whatever the number of workers), then sums
up. Each row is its own run, with its own retries: a row that keeps failing
gets stuck alone, and the upload waits for it instead of starting over. The
summary reads the children's outputs in row order.

Saving a row is an atomic step (``atomic=True``): the contact's upsert, the
``Delivery`` row that records it (no unique key) and the step's output
commit together, so a row whose worker died, or froze past its lease, and
that ran again leaves one ``Delivery``, not two.
"""

import csv
import io

from django.db import IntegrityError, transaction

from django_dispatch.workflows import Workflow

from .models import Contact, Delivery

# --- one row: a child run -----------------------------------------------------------

import_row = Workflow("import_row")


@import_row.step(max_attempts=3, backoff=1, atomic=True)
def save_row(ctx):
    email = ctx.input["email"].strip().lower()
    if "@" not in email:
        raise ValueError(f"row {ctx.input['line']}: {email!r} is not an e-mail address")
    name = ctx.input["name"].strip()
    # An UPDATE first, then an INSERT if it matched nothing: the step's
    # transaction writes before it reads, so on SQLite it holds the write
    # lock from its first statement (a transaction that read, then writes
    # after another's commit, fails at once with "database is locked").
    created = not Contact.objects.filter(email=email).update(name=name)
    if created:
        try:
            # A savepoint: a refused INSERT must not abort the step's transaction.
            with transaction.atomic():
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
