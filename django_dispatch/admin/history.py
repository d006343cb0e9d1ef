"""Operator actions in Django's admin history (``LogEntry``).

Every state change an operator makes from the admin (cancel, retry, replay,
pause, resume, skip, unpark, run now) goes through a service, which Django's
own history does not see: only the admin's add/change/delete forms log
themselves. Without these entries, "who cancelled this job?" has no answer
after an incident. Each acted-on row gets an entry saying what was done, so
its History page and the admin's "Recent actions" show it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model
from django.http import HttpRequest

#: Entries written per statement.
BATCH = 1000


def record(
    request: HttpRequest,
    model: type[Model],
    rows: Iterable[tuple[Any, str]],
    message: str,
    *,
    flag: int = CHANGE,
) -> int:
    """Log ``message`` for each ``(pk, repr)`` of ``model`` as the request's user.

    Written in batches, so a "select all" over many rows costs few statements.
    Returns the number of entries written.
    """
    user_id = request.user.pk
    if user_id is None:  # admin views always have a user; never log as nobody
        raise ValueError("admin history needs a logged-in user")
    content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
    written = 0
    batch: list[LogEntry] = []
    for pk, text in rows:
        batch.append(
            LogEntry(
                user_id=user_id,
                content_type=content_type,
                object_id=str(pk),
                object_repr=text[:200],
                action_flag=flag,
                change_message=message,
            )
        )
        if len(batch) >= BATCH:
            written += len(LogEntry.objects.bulk_create(batch))
            batch = []
    if batch:
        written += len(LogEntry.objects.bulk_create(batch))
    return written


def record_one(request: HttpRequest, obj: Model, message: str, *, flag: int = CHANGE) -> None:
    """Log ``message`` for one row."""
    record(request, type(obj), [(obj.pk, str(obj))], message, flag=flag)
