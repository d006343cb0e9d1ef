"""Demo workflows: a checkout you can watch (and operate) in the admin.

``checkout``: reserve stock -> charge the card -> in parallel, send the
receipt and ship the order (shipping is a child workflow) -> close the order.

Every step records a ``Delivery`` row, so the admin's "Deliveries" page
shows what ran, and how often. The card ``"declined"`` never goes through:
that run gets *stuck* at ``charge_card`` after its attempts, waiting for a
person to retry it (after "fixing" the card), skip the step, or cancel it,
from Django's admin (Workflow runs).
"""

from django_dispatch.workflows import EventTimeout, Workflow

from .models import Delivery


def record(ctx, detail):
    Delivery.objects.create(
        task=f"{ctx.step} (run {ctx.run_id})", attempt=ctx.attempt, detail=detail
    )


# --- shipping: started by checkout's ship step, as a child run ----------------------

shipping = Workflow("shipping")


@shipping.step()
def pack(ctx):
    record(ctx, f"packed order {ctx.input['order_id']}")
    return {"parcels": 1}


@shipping.step()
def print_label(ctx):
    label = f"PARCEL-{ctx.input['order_id']:05d}"
    record(ctx, f"label {label}")
    return {"tracking": label, "parcels": ctx.outputs["pack"]["parcels"]}


# --- checkout --------------------------------------------------------------------------

checkout = Workflow("checkout")


@checkout.step()
def reserve_stock(ctx):
    items = ctx.input["items"]
    record(ctx, f"reserved {len(items)} item(s) for order {ctx.input['order_id']}")
    return {"reserved": items}


@checkout.step(max_attempts=3, backoff=0, timeout=10)
def charge_card(ctx):
    """A flaky gateway: the first attempt times out, the retry goes through.

    The card ``"declined"`` fails its first three attempts, which parks the
    run as stuck; retrying it from the admin (a fourth attempt) succeeds.
    ``backoff=0`` keeps the demo inside one ``rundispatch --burst``; real
    code waits longer (the default is exponential).
    """
    record(ctx, f"charging {ctx.input['amount_cents']} cents")
    if ctx.input["card"] == "declined" and ctx.attempt <= 3:
        raise PermissionError(
            "card declined (simulated: retry the stuck run from the admin and it goes through)"
        )
    if ctx.input["card"] != "declined" and ctx.attempt == 1:
        raise ConnectionError("payment gateway timed out (simulated; the step will retry)")
    return {"charge_id": f"ch_{ctx.input['order_id']}", "attempt": ctx.attempt}


@checkout.step(after=["charge_card"], max_attempts=5, backoff=0)
def send_receipt(ctx):
    charge = ctx.outputs["charge_card"]["charge_id"]
    record(ctx, f"receipt for {charge} to {ctx.input['email']}")
    return {"sent_to": ctx.input["email"]}


@checkout.step(after=["charge_card"])
def ship(ctx):
    """Starts the shipping workflow and waits for it: its output becomes this step's."""
    return ctx.start_child(shipping, {"order_id": ctx.input["order_id"]})


@checkout.step(after=["send_receipt", "ship"])
def close_order(ctx):
    record(ctx, f"order {ctx.input['order_id']} closed")
    return {
        "order_id": ctx.input["order_id"],
        "tracking": ctx.outputs["ship"]["tracking"],
        "receipt_to": ctx.outputs["send_receipt"]["sent_to"],
    }


# --- invoice: waits for its payment, durably -----------------------------------------
#
# ``python manage.py start_invoice_demo`` starts a run; it sends the invoice,
# then waits (holding no worker) for the event ``payment.received`` with key
# ``invoice:<id>``, which ``python manage.py publish_event`` or the admin's
# Events page ("Publish an event...") publishes. Unpaid after ``timeout``
# seconds, the invoice is voided instead.

invoice = Workflow("invoice")


@invoice.step()
def send_invoice(ctx):
    # A side effect: in its own step, so resuming the wait below never repeats it.
    record(ctx, f"invoice {ctx.input['invoice_id']} sent to {ctx.input['email']}")
    return {"sent": True}


@invoice.step(after=["send_invoice"])
def await_payment(ctx):
    """Waits for the payment event; on resume this step runs again from the top,
    and the wait returns the event's payload (or raises EventTimeout)."""
    key = f"invoice:{ctx.input['invoice_id']}"
    try:
        payment = ctx.wait_for_event("payment.received", key=key, timeout=ctx.input["timeout"])
    except EventTimeout:
        record(ctx, f"invoice {ctx.input['invoice_id']} voided: no payment in time")
        return {"status": "voided"}
    record(ctx, f"invoice {ctx.input['invoice_id']} paid: {payment}")
    return {"status": "paid", "payment": payment, "started_by": ctx.call_context}
