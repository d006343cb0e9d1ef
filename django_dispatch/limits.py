"""Size limits, at their documented path (``django_dispatch.limits.JSONTooLarge``).

The logic is ``core.limits``; the settings are read by ``tasks.values``.
"""

from .core.limits import JSONTooLarge

__all__ = ["JSONTooLarge"]
