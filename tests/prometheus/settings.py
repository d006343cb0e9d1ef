"""The suite's settings, with the metrics view routed (``urls``) for the web process
that the ``prometheus`` tier starts beside the workers."""

from tests.settings import *  # noqa: F403

ROOT_URLCONF = "tests.prometheus.urls"
