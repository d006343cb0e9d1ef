"""Demo tasks, written with ``django_dispatch.task``: Django's ``@task``, taking
our options (``max_attempts``, ``backoff``, ``timeout``) on every supported Django.

Each task records a ``Delivery`` row so that ``manage.py show_demo`` (or the
admin) shows what ran. Arguments and return values are plain JSON: ids,
strings, numbers, lists and dicts.
"""

import asyncio
import time

from django.db import transaction

from django_dispatch import task

from .models import Delivery, Payment


def retry_immediately(exception, task_result):
    """Backoff for the demo: retry at once (returning None would stop retrying).

    The default backoff waits 1 s, 2 s, 4 s, ... with jitter; ``rundispatch
    --burst`` exits as soon as nothing is runnable *now*, so the demo's retries
    must be runnable at once to finish within one burst.
    """
    return 0


@task
def send_welcome(user_id):
    """A plain task: no options at all."""
    Delivery.objects.create(task="send_welcome", detail=f"welcome e-mail to user {user_id}")
    return f"welcome sent to user {user_id}"


@task(priority=10, queue_name="emails")
def send_receipt(order_id, email):
    """A high-priority task on its own queue (`rundispatch --queues emails`)."""
    Delivery.objects.create(task="send_receipt", detail=f"receipt for order {order_id} to {email}")
    return {"order_id": order_id, "sent_to": email}


@task
def process_order(customer_id, order_id):
    """Enqueued with ``using(partition_key=f"customer:{customer_id}")``: one
    customer's orders are processed one at a time, in the order they were
    placed, on whichever workers; different customers' orders in parallel."""
    Delivery.objects.create(
        task="process_order", detail=f"customer {customer_id}: order {order_id} processed"
    )
    return order_id


@task
def nightly_report():
    """Declared in settings.DISPATCH["CRON"]: runs at 03:00 Paris time."""
    Delivery.objects.create(task="nightly_report", detail="nightly report built")
    return "ok"


@task(max_attempts=3, backoff=retry_immediately, takes_context=True)
def charge_card(context, order_id, amount_cents):
    """Fails on its first attempt (a flaky payment gateway), succeeds on the retry."""
    attempt = context.attempt  # 1 on the first attempt, 2 on the first retry, ...
    Delivery.objects.create(
        task="charge_card",
        job_id=context.task_result.id,
        attempt=attempt,
        detail=f"charge {amount_cents} cents for order {order_id}",
    )
    if attempt == 1:
        raise ConnectionError("payment gateway timed out (simulated; the job will retry)")
    return {"order_id": order_id, "charged_cents": amount_cents, "attempt": attempt}


@task(atomic=True, max_attempts=3, backoff=retry_immediately, takes_context=True)
def record_payment(context, order_id, amount_cents, email):
    """Exactly-once database effects: the payment row, the receipt's job and this
    job's success commit in one transaction, or not at all.

    The first attempt fails after writing (a busy ledger, simulated): its
    payment row and its receipt job roll back with it, and the retry records
    the payment once. The e-mail is sent by the follow-up job, which exists
    only if the payment committed (the transactional outbox): sending it from
    here would send it again on every retry.
    """
    Payment.objects.create(
        order_id=order_id, amount_cents=amount_cents, job_id=context.task_result.id
    )
    send_receipt.enqueue(order_id, email)
    if context.attempt == 1:
        raise ConnectionError("the ledger is busy (simulated; the payment rolls back, retries)")
    return {"order_id": order_id, "paid_cents": amount_cents, "attempt": context.attempt}


@task
async def fetch_exchange_rate(currency):
    """An ``async def`` task: it runs on an event loop in the worker's job thread."""
    await asyncio.sleep(0.01)  # stands for an HTTP call
    rate = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85}.get(currency, 1.0)
    await Delivery.objects.acreate(task="fetch_exchange_rate", detail=f"{currency} = {rate}")
    return {"currency": currency, "rate": rate}


@task(max_attempts=2, backoff=retry_immediately, takes_context=True)
def rebuild_search_index(context, total):
    """A long task that saves its progress and resumes from it.

    ``context.checkpoint`` is the last value saved with ``context.progress()``
    (None on the first attempt). The first attempt "crashes" after item 3;
    the retry resumes at item 4, so every item is indexed exactly once.
    """
    start = (context.checkpoint or 0) + 1
    for item in range(start, total + 1):
        if context.attempt == 1 and item == 4:
            raise RuntimeError("simulated crash after item 3 (the retry resumes at item 4)")
        # The item and its checkpoint commit together: both live on the same
        # database, and progress() writes on this thread's connection.
        with transaction.atomic():
            Delivery.objects.create(
                task="rebuild_search_index",
                job_id=context.task_result.id,
                attempt=context.attempt,
                detail=f"indexed item {item} of {total}",
            )
            context.progress(item)  # also renews the lease
    return {"indexed": total, "resumed_from": start, "attempt": context.attempt}


@task(timeout=2, max_attempts=1, takes_context=True)
def generate_report(context, seconds):
    """A task with a time limit: attempts longer than 2 s fail with TaskTimeout.

    (The limit leaves the demo's 0.1 s report room for its write: on SQLite it
    may wait its turn for the one write lock behind the other demo jobs.)

    A thread cannot be killed, so a long sync task should check
    ``context.cancelled`` (set when the attempt times out or the job is
    cancelled) and stop; whatever it returns after that is discarded.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if context.cancelled:
            return None
        time.sleep(0.02)
    Delivery.objects.create(
        task="generate_report", job_id=context.task_result.id, detail=f"{seconds} s report"
    )
    return f"report built in {seconds} s"


@task(takes_context=True)
def export_deliveries(context):
    """Saves an artifact: a CSV of every delivery so far, kept for a week.

    ``save_artifact`` stores it through ``STORAGES["default"]`` (here the
    ``media/`` directory), linked to this job and attempt; read it back with
    ``artifacts.find(job_id, "deliveries.csv")`` or download it from the job's
    admin page. See docs/artifacts.md.
    """
    rows = Delivery.objects.order_by("id").values_list("id", "task", "detail")
    csv = "id,task,detail\n" + "".join(f'{i},{t},"{d}"\n' for i, t, d in rows)
    artifact = context.save_artifact("deliveries.csv", csv.encode(), expires_in=7 * 86400)
    Delivery.objects.create(
        task="export_deliveries",
        job_id=context.task_result.id,
        detail=f"{artifact.size} bytes saved as artifact #{artifact.id}",
    )
    # Its size depends on which demo jobs ran before it (they run concurrently),
    # so the result names the artifact and leaves the size to its record.
    return {"artifact": artifact.id, "name": "deliveries.csv"}
