"""Temporary alias while importers move: ``core.encoding`` and ``tasks.values``."""

from .core.encoding import *  # noqa: F403
from .tasks.values import encode_json, to_json  # noqa: F401
