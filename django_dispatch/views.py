"""Views to add to a project's ``urls.py``.

``metrics``: Prometheus's text format of the cluster gauges (queue depth per
state, oldest waiting job, live workers, busy slots) and this web process's
``dispatch_*`` counters (jobs enqueued here; every process's in
prometheus_client's multiprocess mode). Needs prometheus-client
(``pip install "django-dispatch[prometheus]"``)::

    from django_dispatch.views import metrics

    urlpatterns = [..., path("dispatch/metrics", metrics)]

The cluster gauges come from one bounded query set, reused for
``observability.metrics.VIEW_CACHE_SECONDS``, however often it is scraped.
The view has no access control of its own: serve it where only your
Prometheus can reach it, or wrap it (``staff_member_required``, a
middleware checking a token).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from .observability import exposition
from .observability import metrics as dispatch_metrics


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not dispatch_metrics.AVAILABLE:
        return HttpResponse(
            "prometheus-client is not installed: pip install 'django-dispatch[prometheus]'\n",
            status=501,
            content_type="text/plain; charset=utf-8",
        )
    body, content_type = exposition.render_view(request.headers.get("Accept"))
    return HttpResponse(body, content_type=content_type)
