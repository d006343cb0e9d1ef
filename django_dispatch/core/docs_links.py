"""Links to the documentation, for error messages and system check hints.

Messages are read by users of the installed package, who have no ``docs/``
directory. No documentation site is published before the first release, so
a link goes to the page's Markdown in the source repository (the
``Source`` URL in pyproject.toml), which GitHub renders with the same
GitHub-style heading anchors that the Markdown files link each other with
(and that MkDocs keeps, see ``docs/_hooks``). Every link is built here, so
the address lives in one place, and a test checks that each page and anchor
used exists.
"""

from __future__ import annotations

__all__ = ["DOCS_ROOT", "PAGES", "docs_url"]

#: The ``docs/`` directory of the source repository, on ``main``.
DOCS_ROOT = "https://github.com/django-dispatch/django-dispatch/blob/main/docs/"

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
    return f"{DOCS_ROOT}{page}.md{'#' + anchor if anchor else ''}"
