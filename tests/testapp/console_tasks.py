"""Tasks for the console's incident walk-through (tests/admin/test_admin_console_browser.py).

``deliver`` fails until the test "fixes the address book" (a SideEffect row
with key ``address-book-fixed``), so the story can end with a replay that works.
"""

import os

from django_dispatch import task
from tests.testapp.models import SideEffect

FIXED = "address-book-fixed"


@task(queue_name="default")
def deliver(customer):
    if not SideEffect.objects.filter(key=FIXED).exists():
        raise LookupError(f"customer {customer} has no address")
    SideEffect.objects.create(key=f"delivered-{customer}", worker_pid=os.getpid())
    return f"delivered to {customer}"


@task(queue_name="emails")
def send_email(to):
    return to
