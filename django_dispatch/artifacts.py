"""Artifacts: what jobs and workflow steps saved with ``save_artifact`` (the public face).

::

    from django_dispatch import artifacts

    report = artifacts.find(result.id, "report.pdf")   # the newest attempt's
    with artifacts.open(report) as f:
        ...

The reads are ``queries.artifacts``; link, update and delete are
``services.artifacts``.
"""

from .models import Artifact, ArtifactLink
from .queries.artifacts import (
    ArtifactPage,
    find,
    find_by_key,
    for_owner,
    get,
    get_record,
    links,
    open,
    page,
)
from .services.artifacts import delete, link, update

__all__ = [
    "Artifact",
    "ArtifactLink",
    "ArtifactPage",
    "delete",
    "find",
    "find_by_key",
    "for_owner",
    "get",
    "get_record",
    "link",
    "links",
    "open",
    "page",
    "update",
]
