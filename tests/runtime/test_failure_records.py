"""Failure records: a code to group by, and texts redacted before they are stored or logged."""

from __future__ import annotations

import logging

import pytest

from django_dispatch.admin.common import render_errors
from django_dispatch.conf import get_settings
from django_dispatch.core.states import JobState
from django_dispatch.models import Job
from django_dispatch.testing import drain
from tests.testapp import failure_tasks

pytestmark = pytest.mark.django_db(transaction=True)

REDACTOR = "tests.testapp.failure_tasks.scrub"


def _last_error(result_id: str) -> dict:
    job = Job.objects.get(pk=result_id)
    assert job.state == JobState.FAILED
    return job.errors[-1]


def test_a_failure_records_the_exceptions_code_or_else_its_class():
    declined = failure_tasks.charge.enqueue("ann@example.com")
    plain = failure_tasks.plain_failure.enqueue("bob@example.com")
    drain()
    error = _last_error(declined.id)
    assert error["code"] == "payment_declined"
    assert error["exception_class_path"] == "tests.testapp.failure_tasks.PaymentDeclined"
    assert _last_error(plain.id)["code"] == "builtins.ValueError"
    html = str(render_errors([error]))
    assert "[payment_declined]" in html and "PaymentDeclined" in html


def test_the_redactor_keeps_personal_data_out_of_stored_errors_and_logs(settings, caplog):
    settings.DISPATCH = {**settings.DISPATCH, "ERROR_REDACTOR": REDACTOR}
    enqueued = failure_tasks.charge.enqueue("ann@example.com")
    with caplog.at_level(logging.INFO):
        drain()
    error = _last_error(enqueued.id)
    assert error["message"] == "card of [email] declined"
    assert "[email]" in error["traceback"] and "ann@example.com" not in error["traceback"]
    logged = [r for r in caplog.records if getattr(r, "dispatch_job_id", None) == int(enqueued.id)]
    assert logged and all(r.dispatch_error_code == "payment_declined" for r in logged)
    everything = "\n".join(
        r.getMessage() + (logging.Formatter().formatException(r.exc_info) if r.exc_info else "")
        for r in caplog.records
    )
    assert "card of [email] declined" in everything
    assert "ann@example.com" not in everything  # nor in Django's own task logs


def test_a_redactor_that_raises_stores_a_placeholder_and_the_worker_goes_on(settings):
    settings.DISPATCH = {
        **settings.DISPATCH,
        "ERROR_REDACTOR": "tests.testapp.failure_tasks.broken_redactor",
    }
    enqueued = failure_tasks.charge.enqueue("ann@example.com")
    after = failure_tasks.plain_failure.enqueue("bob@example.com")
    assert drain() == 2
    error = _last_error(enqueued.id)
    placeholder = "[not stored: DISPATCH['ERROR_REDACTOR'] raised RuntimeError"
    assert error["message"].startswith(placeholder)
    assert "ann@example.com" not in str(error)
    # The code of its own class stays; one the redactor could not clear falls back to the class.
    assert _last_error(after.id)["code"] == "builtins.ValueError"
    assert error["code"] == "tests.testapp.failure_tasks.PaymentDeclined"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("tests.testapp.failure_tasks.nowhere", "cannot be imported"),
        ("tests.testapp.failure_tasks.EMAIL", "is not callable"),
        (42, "must be a dotted path"),
    ],
)
def test_a_bad_redactor_setting_is_named_by_the_checks(settings, value, problem):
    settings.DISPATCH = {**settings.DISPATCH, "ERROR_REDACTOR": value}
    problems = [p for p in get_settings().validate() if "ERROR_REDACTOR" in p]
    assert len(problems) == 1 and problem in problems[0], problems
