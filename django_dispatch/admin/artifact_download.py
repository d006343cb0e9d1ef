"""The admin's artifact download: permission-checked, streamed from the storage.

Artifacts may hold anything a job produced (reports with customer data,
exports), so they are never served through a storage URL, which anyone
holding the link could fetch. This view is wrapped by ``admin_site.admin_view``
(anonymous users go to the login page, non-staff users are refused) and
requires ``django_dispatch.download_artifact``; the file is streamed in
chunks from whatever storage holds it.
"""

from __future__ import annotations

import posixpath

from django.core.exceptions import PermissionDenied
from django.core.files.storage import storages
from django.http import FileResponse, Http404, HttpRequest

from ..models import Artifact
from ..store import read_database_for
from .common import has_perm


def download_artifact(request: HttpRequest, artifact_id: int) -> FileResponse:
    """The live artifact's file as an attachment; 403 without the permission, 404 if gone."""
    if not has_perm(request, "download_artifact"):
        raise PermissionDenied("You need the 'Can download artifacts' permission.")
    live = Artifact.objects.using(read_database_for(None, Artifact))
    artifact = live.filter(id=artifact_id, deleted_at=None).first()
    if artifact is None:
        raise Http404(f"artifact {artifact_id} does not exist or was deleted")
    try:
        f = storages[artifact.storage].open(artifact.name, "rb")
    except (FileNotFoundError, OSError) as e:
        raise Http404(f"artifact {artifact_id}'s file is not in its storage: {e}") from e
    return FileResponse(
        f,
        as_attachment=True,
        filename=posixpath.basename(artifact.name),
        content_type=artifact.content_type or "application/octet-stream",
    )
