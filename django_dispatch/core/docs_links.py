"""Links to the online documentation, for error messages and system check hints.

Messages are read by users of the installed package, who have no ``docs/``
directory: they get the address of the page on the documentation site
instead of a path in the repository. Every link is built here, so the site's
address and its URL scheme (MkDocs: ``docs/tasks.md`` is served as
``tasks/``, with GitHub-style heading anchors, see ``docs/_hooks``) live in
one place, and a test checks that each page and anchor used exists.
"""

from __future__ import annotations

__all__ = ["DOCS_ROOT", "PAGES", "docs_url"]

#: The documentation site, the version that matches the code on ``main``.
DOCS_ROOT = "https://django-dispatch.readthedocs.io/en/latest/"

#: The pages of the site, as their file names under ``docs/`` without ``.md``.
PAGES = frozenset(
    {
        "index",
        "install",
        "tasks",
        "settings",
        "worker",
        "deployment",
        "operating",
        "scheduling",
        "workflows",
        "events",
        "artifacts",
        "testing",
        "reference",
        "performance",
        "architecture",
        "migrating/celery",
        "migrating/django-q2",
        "migrating/django-tasks-db",
    }
)


def docs_url(page: str, anchor: str = "") -> str:
    """The address of ``page`` (``"tasks"`` for ``docs/tasks.md``), at section ``anchor``.

    ``anchor`` is the heading's GitHub-style slug, as in links between the
    Markdown files (``"timeouts"``, ``"retries-max_attempts-and-backoff"``).
    An unknown page raises ``ValueError``: a typo must fail the tests that
    produce the message, not send a user to a missing page.
    """
    if page not in PAGES:
        raise ValueError(f"{page!r} is not a documentation page; use one of {sorted(PAGES)}.")
    path = "" if page == "index" else f"{page}/"
    return f"{DOCS_ROOT}{path}{'#' + anchor if anchor else ''}"
