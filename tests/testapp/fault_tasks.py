"""Tasks whose database connection is cut under them, for the fault tests."""

import os

from django.db import connection

from django_dispatch.compat import task

from .models import SideEffect


def _cut_own_connection() -> None:
    """What a server restart does to a task's next query, done to this one backend."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


@task()
def cut_connection_once(key):
    """The first run loses its connection mid-task; the second succeeds."""
    SideEffect.objects.create(key=key, worker_pid=os.getpid(), note="start")
    if SideEffect.objects.filter(key=key).count() == 1:
        _cut_own_connection()
    return key


@task()
def cut_connection_always(key):
    SideEffect.objects.create(key=key, worker_pid=os.getpid(), note="start")
    _cut_own_connection()


@task()
def bad_sql(key):
    """A database error of the task's own making: its connection still works."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table_here")
