"""The task context, at its documented path (``django_dispatch.context.DispatchTaskContext``).

The class lives in ``tasks.context``.
"""

from .tasks.context import DispatchTaskContext

__all__ = ["DispatchTaskContext"]
