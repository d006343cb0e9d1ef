"""The metrics view at the path docs/operating.md shows, for the tier's web process."""

from django.urls import path

from django_dispatch.views import metrics

urlpatterns = [path("dispatch/metrics", metrics)]
