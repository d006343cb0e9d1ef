"""Which database the current alias's rows are on: ``db_alias()`` and its setters.

Every row an alias owns lives in ``TASKS[alias]["OPTIONS"]["DATABASE"]``
when it is set, and where the project's routers put ``Job`` otherwise (all
a site with one database ever sees). The store's functions take ``db=`` or
call ``db_alias()``; the entry points (an enqueue, a list function, a
service, an admin request) wrap their work in ``using_backend(alias)``, and
``rundispatch --backend ALIAS`` sets the database for its whole process with
``serve_database``. ``store.base`` re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.conf import settings
from django.db import router
from django.db.models import Model

from ..models import Job

__all__ = [
    "alias_database",
    "caller_database",
    "carrying_database",
    "database_for",
    "db_alias",
    "read_database_for",
    "routed_database",
    "serve_database",
    "using_backend",
    "using_database",
]


def alias_database(alias: str) -> str | None:
    """``TASKS[alias]["OPTIONS"]["DATABASE"]``, None when it is not set (or not a
    name: system check E080 reports it; the routers choose meanwhile).

    Read from the setting each time, not from the built backend: the store
    routes by alias below the tasks layer, and ``override_settings`` holds.
    """
    params = (getattr(settings, "TASKS", None) or {}).get(alias)
    options = params.get("OPTIONS") if isinstance(params, dict) else None
    database = options.get("DATABASE") if isinstance(options, dict) else None
    return database if isinstance(database, str) and database else None


#: The database named by the innermost ``using_database``/``using_backend`` of
#: this thread or task; None outside them.
_CONTEXT_DATABASE: ContextVar[str | None] = ContextVar("django_dispatch_database", default=None)
#: The database this whole process serves (``rundispatch --backend ALIAS``).
#: A module global, not a ContextVar: a new thread (a job thread, the
#: heartbeat, the listener) starts with an empty context, and forked
#: ``--processes`` children and a recycled process inherit or re-derive it.
_served_database: str | None = None


def db_alias() -> str:
    """The database holding the current alias's rows: jobs and every other table.

    In order: the innermost ``using_database``/``using_backend`` (the entry
    points: an enqueue, a list function, a service, an admin request, each
    for its alias); else the database this process serves (``serve_database``,
    set once by ``rundispatch --backend``); else the project's routers'
    choice for ``Job``, which is all a site with one database ever sees.
    """
    database = _CONTEXT_DATABASE.get()
    if database is not None:
        return database
    if _served_database is not None:
        return _served_database
    return router.db_for_write(Job)


def database_for(alias: str | None) -> str:
    """The database of TASKS alias ``alias`` (None: ``"default"``):
    ``OPTIONS["DATABASE"]``, else the routers' choice for ``Job``.

    Never the served or the current database: a job enqueued on alias
    ``default`` from a task running in the ``eu`` worker goes where
    ``default``'s rows are, not to ``eu``'s database.
    """
    return alias_database(alias or "default") or router.db_for_write(Job)


def routed_database() -> str | None:
    """The database a ``using_database``/``using_backend`` block or
    ``serve_database`` names here; None when the routers choose."""
    database = _CONTEXT_DATABASE.get()
    return database if database is not None else _served_database


def read_database_for(alias: str | None, model: type[Model] = Job) -> str:
    """Where to read ``model``'s rows of TASKS alias ``alias`` when no write
    depends on the answer: ``OPTIONS["DATABASE"]``, else the routers' read
    choice (a site without per-alias databases). None: the current alias's
    (``routed_database``), else the routers' read choice."""
    database = alias_database(alias or "default") if alias is not None else routed_database()
    return database or router.db_for_read(model)


@contextmanager
def using_database(database: str) -> Iterator[str]:
    """Make ``db_alias()`` name ``database`` inside the block (this thread or task only)."""
    token = _CONTEXT_DATABASE.set(database)
    try:
        yield database
    finally:
        _CONTEXT_DATABASE.reset(token)


def caller_database() -> str:
    """Where a public function called with ``backend=None`` acts: the database
    of the innermost ``using_database``/``using_backend`` block (the admin
    wraps each request in one), else the ``default`` alias's (``database_for``).

    Never the database this process serves (``serve_database``): that one is
    for the worker's own store calls. A task running in the ``eu`` worker
    that enqueues a ``default`` job and cancels it by id must reach the
    ``default`` alias's database, where the job is, not the ``eu`` job that
    has the same id (ids are unique within one database only).
    """
    database = _CONTEXT_DATABASE.get()
    return database if database is not None else database_for("default")


@contextmanager
def using_backend(alias: str | None) -> Iterator[str]:
    """Make ``db_alias()`` name TASKS alias ``alias``'s database inside the block
    (``database_for``); yields it. None: the caller's database
    (``caller_database``: the enclosing block's, else the ``default``
    alias's; never the served one)."""
    database = database_for(alias) if alias is not None else caller_database()
    with using_database(database):
        yield database


def carrying_database[**P, R](target: Callable[P, R]) -> Callable[P, R]:
    """``target``, made to run under this thread's current ``using_database``
    block when it runs on another thread: a new thread starts with an empty
    context. For the threads a worker starts (job threads, the reporter, the
    async loop): the worker ``run_now`` builds inside a web process serves the
    alias's database, not the routers' one. ``target`` itself outside a block."""
    database = _CONTEXT_DATABASE.get()
    if database is None:
        return target

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with using_database(database):
            return target(*args, **kwargs)

    return run


def serve_database(database: str | None) -> None:
    """Make ``db_alias()`` name ``database`` in every thread of this process,
    outside any ``using_database`` block (None: the routers' choice again).
    Set by the worker before it starts a thread."""
    global _served_database
    _served_database = database
