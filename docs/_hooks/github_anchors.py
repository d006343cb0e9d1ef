"""MkDocs hook: make heading anchors the way GitHub does.

The docs are read on the site and as Markdown files in the repository (the
README links to them), so one link such as ``worker.md#--processes`` must work
on both. Python-Markdown's default slugify collapses runs of hyphens
(``--processes`` becomes ``-processes``); GitHub keeps every hyphen and turns
each space into one. Loaded by ``hooks:`` in mkdocs.yml; excluded from the
site by ``exclude_docs``.
"""

import re
from typing import Any

_NOT_SLUG = re.compile(r"[^\w\- ]")


def github_slugify(value: str, separator: str) -> str:
    """GitHub's rule: lower case, drop punctuation but ``-`` and ``_``, one ``-`` per space."""
    return _NOT_SLUG.sub("", value.strip().lower()).replace(" ", separator)


def on_config(config: Any) -> Any:
    config["mdx_configs"].setdefault("toc", {})["slugify"] = github_slugify
    return config
