"""Tasks for the chaos suite (tests/chaos/): every execution leaves a counted row.

Each run of a task inserts one ``SideEffect`` row (``note="run"``) with the
job id, the attempt, the worker's pid and the thread, before doing anything
else; a success the worker wins (its fenced write committed) adds one
``note="finished"`` row from the ``task_finished`` receiver below. The suite
counts them: a second "run" row for a job is a duplicate side effect, allowed
only for an attempt that a fault cut short; a second "finished" row would be a
job finished twice.
"""

from __future__ import annotations

import os
import threading
import time

from django.db import connection, transaction
from django.dispatch import receiver
from django.tasks import TaskResultStatus, task
from django.tasks.signals import task_finished
from django.utils import timezone

from .models import SideEffect

#: What the "finished" receiver counts.
COUNTED = {"tests.testapp.chaos_tasks.work", "tests.testapp.chaos_tasks.work_in_transaction"}


def _ran(context, key: str) -> SideEffect:
    return SideEffect.objects.create(
        key=key,
        job_id=context.task_result.id,
        worker_pid=os.getpid(),
        started_at=timezone.now(),
        note="run",
    )


@task(takes_context=True)
def work(context, key: str, seconds: float = 0.05):
    """The load: one counted side effect, ``seconds`` of work, and a last write.

    The last write makes a fault during the work reach the task's own code,
    as it would reach any task that uses the database after a while.
    """
    row = _ran(context, key)
    time.sleep(seconds)
    SideEffect.objects.filter(pk=row.pk).update(finished_at=timezone.now())
    return {"key": key, "thread": threading.get_ident()}


@task(takes_context=True)
def work_in_transaction(context, key: str, seconds: float = 0.05):
    """``work`` with its work and last write inside ``transaction.atomic()``.

    A fault during the work breaks the transaction: Django's ``atomic`` then
    fails to roll back and drops the connection before the worker sees the
    exception.
    """
    row = _ran(context, key)
    with transaction.atomic():
        SideEffect.objects.filter(pk=row.pk).select_for_update().exists()
        time.sleep(seconds)
        SideEffect.objects.filter(pk=row.pk).update(finished_at=timezone.now())
    return {"key": key, "thread": threading.get_ident()}


@task(takes_context=True)
def over_statement_timeout(context, key: str, seconds: float):
    """Runs SQL longer than the server's ``statement_timeout``: its own error."""
    _ran(context, key)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [seconds])
    return key


@task(takes_context=True)
def idle_in_transaction(context, key: str, seconds: float):
    """Sits idle in a transaction longer than ``idle_in_transaction_session_timeout``.

    The server ends the session: the task's next query fails, and the
    connection it leaves behind is dead (the next job on this thread must not
    get it).
    """
    _ran(context, key)
    with transaction.atomic():
        SideEffect.objects.filter(key=key).exists()
        time.sleep(seconds)
        SideEffect.objects.filter(key=key).exists()
    return key


@receiver(task_finished)
def _count_finished(sender, task_result, **kwargs) -> None:
    if task_result.task.module_path not in COUNTED:
        return
    if task_result.status != TaskResultStatus.SUCCESSFUL:
        return
    SideEffect.objects.create(
        key=task_result.args[0] if task_result.args else "",
        job_id=task_result.id,
        worker_pid=os.getpid(),
        finished_at=timezone.now(),
        note="finished",
    )
