"""Async tasks for the asyncio executor's tests (``rundispatch --async-concurrency``)."""

import asyncio
import os
import threading
import time

from asgiref.sync import sync_to_async
from django.db import connection

from django_dispatch import task

from .models import Execution


@task()
async def window(seconds: float = 0.3):
    """When it ran and where: overlapping windows prove jobs ran at once."""
    started = time.time()
    await asyncio.sleep(seconds)
    return {"start": started, "end": time.time(), "thread": threading.current_thread().name}


@task()
def sync_window(seconds: float = 0.05):
    started = time.time()
    time.sleep(seconds)
    return {"start": started, "end": time.time(), "thread": threading.current_thread().name}


def _record(key: str) -> int:
    """One counted row, and the database session that wrote it."""
    Execution.objects.create(key=key, worker_pid=os.getpid())
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@task()
async def orm_write(key: str):
    """Async ORM use as Django documents it: the write goes through sync_to_async."""
    await asyncio.sleep(0.05)
    return await sync_to_async(_record)(key)


@task(timeout=0.3)
async def overtime(seconds: float = 5):
    await asyncio.sleep(seconds)
    return "late"


@task(takes_context=True, max_attempts=2)
async def fails_first(context, key: str):
    if context.attempt == 1:
        raise ValueError(f"{key}: the first attempt fails")
    return context.attempt


@task()
async def sleeps(seconds: float, key: str = ""):
    await asyncio.sleep(seconds)
    if key:
        await sync_to_async(Execution.objects.create)(key=key, worker_pid=os.getpid())
    return key
