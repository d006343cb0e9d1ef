"""Tasks that record the call context they see, and the defaults of DISPATCH["CALL_CONTEXT"]."""

import json

from django_dispatch import task
from tests.testapp.models import SideEffect

#: What ``current`` returns: tests set it, as a middleware would per request.
CURRENT: dict = {}


def current():
    """A DISPATCH["CALL_CONTEXT"] default: the "request's" context, None outside one."""
    return CURRENT.get("value")


def broken():
    raise LookupError("no request here")


def not_a_dict():
    return ["user", 42]


@task(takes_context=True)
def record(context, key):
    SideEffect.objects.create(key=key, note=json.dumps(context.call_context))


@task(takes_context=True, max_attempts=2, backoff=lambda exc, result: 0)
def record_then_fail_once(context, key):
    """Records each attempt's call context; the first attempt fails."""
    job_id = context.task_result.id
    SideEffect.objects.create(key=key, note=json.dumps(context.call_context), job_id=job_id)
    if SideEffect.objects.filter(job_id=job_id).count() < 2:
        raise RuntimeError("first attempt fails")


@task(max_attempts=1)
def always_fails():
    raise RuntimeError("for good")
