"""What operators watch: logs with structured fields, Prometheus metrics,
OpenTelemetry traces and a health check.

* ``joblog``: the one hook the worker calls when a job starts, ran and ends.
  It writes the log record of every outcome that is not a success (with
  ``dispatch_*`` fields as ``extra``) and counts it in the metrics.
* ``metrics``: Prometheus counters, histograms and gauges (optional extra
  ``django-dispatch[prometheus]``); ``rundispatch --metrics-port`` and
  ``django_dispatch.views.metrics`` serve them.
* ``tracing``: a producer span around ``enqueue`` and a consumer span around
  each attempt (optional extra ``django-dispatch[otel]``).
* ``health``: is this host's worker heartbeating, does the database answer
  (``manage.py dispatch_health``).

Neither optional package is imported unless it is installed, and neither
costs anything then: every hook starts with a check of a module constant.
"""


def installed(name: str) -> bool:
    """Whether the optional package ``name`` can be imported, without importing it.

    A ``None`` in ``sys.modules`` (how tests and users block an import) counts
    as not installed.
    """
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None
