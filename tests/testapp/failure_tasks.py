"""Tasks whose failures carry codes and personal data (failure records, redaction)."""

import re

from django_dispatch import task


class PaymentDeclined(Exception):
    """An API client's error: a stable ``code``, a message with the customer's data."""

    code = "payment_declined"


@task(max_attempts=1)
def charge(email: str) -> None:
    raise PaymentDeclined(f"card of {email} declined")


@task(max_attempts=1)
def plain_failure(email: str) -> None:
    raise ValueError(f"no account for {email}")


EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


def scrub(text: str) -> str:
    """DISPATCH["ERROR_REDACTOR"] of the tests: e-mail addresses out."""
    return EMAIL.sub("[email]", text)


def broken_redactor(text: str) -> str:
    raise RuntimeError("redactor bug")
